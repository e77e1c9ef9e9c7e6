import pytest

from support.analysis import make_run


@pytest.fixture
def tiny_run(tmp_path):
    return make_run(tmp_path)
