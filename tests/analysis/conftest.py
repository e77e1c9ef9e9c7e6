import pytest
from analysis_helpers import make_run


@pytest.fixture
def tiny_run(tmp_path):
    return make_run(tmp_path)
