import pytest

from rehearsal_support import rehearsed


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory):
    """The smoke config's DAG run once, end to end, as its rehearsal (the same folder the
    rehearsal tests check)."""
    return rehearsed("smoke.yaml", tmp_path_factory)
