import pytest
from rehearsal_support import rehearsed


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory):
    """The default config's DAG run once, end to end, as its rehearsal (the same folder the
    rehearsal tests check): configs/tiny.yaml at the rehearsal's sizes, which are smoke.yaml's."""
    return rehearsed("tiny.yaml", tmp_path_factory)
