"""One intra-op thread for the tests that train or evaluate tiny models: on a shared 2-core machine
two threads per process oversubscribe the cores and slow tiny matmuls by an order of magnitude.
Autouse fixtures: a conftest or test module imports the ones it wants (subprocesses get
OMP_NUM_THREADS=1 from the tests that start them)."""

import contextlib

import pytest


@contextlib.contextmanager
def one_thread():
    """torch at one intra-op thread inside the block, the earlier count restored after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(autouse=True, scope="module")
def _one_thread_for_module_fixtures():
    """The same one thread for a module's own fixtures (test_faults.py trains its reference run
    once per module), which pytest sets up before any function's ``_one_thread``: the bitwise
    comparisons with that reference then compare runs made at one thread each, in this process
    and in subprocesses alike, whatever OMP_NUM_THREADS the suite was started with (scripts/test.sh
    gives each of its two pytest processes half the machine's cores)."""
    with one_thread():
        yield
