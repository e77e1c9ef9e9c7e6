import pytest

from stateloop.config import load_yaml
from support.dag import ROOT
from support.rehearsals import SHARED, needs_shared_data, rehearsed, start


@pytest.fixture(scope="session", autouse=True)
def _rehearsals_side_by_side(request, tmp_path_factory):
    """Start every rehearsal the selected tests read at the session's start, side by side, rather
    than each when its first test asks: they use the cores while the other tests run."""
    wanted = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "smoke_dag" in item.fixturenames:
            wanted.append("tiny.yaml")
        if params.get("rehearsal"):
            wanted.append(params["rehearsal"])
    for config in dict.fromkeys(wanted):
        if SHARED.is_dir() or not needs_shared_data(load_yaml(ROOT / "configs" / config)):
            start(config, tmp_path_factory)


@pytest.fixture(scope="session")
def smoke_dag(tmp_path_factory):
    """The default config's DAG run once, end to end, as its rehearsal (the same folder the
    rehearsal tests check): configs/tiny.yaml at the rehearsal's sizes, which are smoke.yaml's.
    It reads nothing of the shared data (tests/rehearse/test_shared_data.py); were that to change,
    its tests skip, saying why, in a clone with nothing beside it."""
    if not SHARED.is_dir() and needs_shared_data(load_yaml(ROOT / "configs" / "tiny.yaml")):
        pytest.skip(f"{SHARED} not found: rehearsing tiny.yaml needs the local data copies beside the checkout")
    return rehearsed("tiny.yaml", tmp_path_factory)
