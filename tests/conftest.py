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
