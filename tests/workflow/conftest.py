import pytest

from dag_helpers import copy_workflow, snakemake


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory):
    """The smoke DAG run once, end to end, in a copy of the workflow."""
    work = copy_workflow(tmp_path_factory.mktemp("smoke"))
    snakemake(work, "--cores", "2", "--configfile", "configs/smoke.yaml", timeout=900)
    return work
