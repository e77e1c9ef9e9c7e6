import sys
from pathlib import Path

import pytest
import torch

from stateloop.evaluate.tasks.files import default_shared_data

sys.path.insert(0, str(Path(__file__).parent))  # tests/helpers.py


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data():
    """../shared/data beside the checkout; tests that need it skip, saying why, in a user's clone."""
    path = default_shared_data()
    if not path.is_dir():
        pytest.skip(f"{path} not found: shared data sits beside the checkout only in the project's workspace")
    return path


@pytest.hookimpl(tryfirst=True)  # before pytest's -m selection reads the markers
def pytest_collection_modifyitems(config, items):
    """Mark the tests that read the tiny rehearsal (the smoke DAG, built once per process, ~7
    minutes) and the paper config's rehearsal: `shared_dag`. scripts/test.sh runs them in one
    pytest process and every other test in a second one, side by side on the two cores, each
    with one torch thread; tests/workflow/conftest.py starts both rehearsals at once. Measured in
    CI (2026-12-02, a fresh clone): 19.1 minutes for this half, 21.6 for the other (with the
    SLURM cluster tests, about 5 minutes of mostly waiting), 23.7 for the whole of .ci/run."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "smoke_dag" in getattr(item, "fixturenames", ()) or params.get("rehearsal") in ("tiny.yaml", "paper.yaml"):
            item.add_marker(pytest.mark.shared_dag)
