import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("STATELOOP_SHARED", ROOT.parent / "shared"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data():
    """../shared/data beside the checkout; tests that need it skip, saying why, in a user's clone."""
    path = SHARED / "data"
    if not path.is_dir():
        pytest.skip(f"{path} not found: shared data sits beside the checkout only in the project's workspace")
    return path


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (scripts/test.sh runs two workers with --dist loadgroup): the tests that
    read a session rehearsal (the smoke DAG, ~7 minutes) share one worker, so it is built once;
    the tests on the one local SLURM cluster share another."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        path = str(item.fspath)
        if "smoke_dag" in fixtures or path.endswith(("test_rehearse.py", "test_report.py", "test_mlflow_ui.py")):
            item.add_marker(pytest.mark.xdist_group("rehearsal"))
        elif path.endswith("test_slurm_cluster.py"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
