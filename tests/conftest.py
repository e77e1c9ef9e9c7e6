import pytest
import torch

from stateloop.evaluate.tasks.files import default_shared_data
from support import example

example.register()  # docs/adding-a-model.md's example model, registered before any test module is collected


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
    minutes) and the paper and ladder configs' rehearsals: `shared_dag`. scripts/test.sh runs them
    in one pytest process and every other test in a second one, side by side on the two cores,
    each with one torch thread; tests/workflow/conftest.py starts the rehearsals at once.

    Those rehearsals alone would leave their half the shorter one, so the tests of
    :data:`BALANCED` (long, and mostly waiting: on the SLURM scheduler, on a DAG of their own, on
    Snakemake dry runs, on lm-eval's whole task index, on four-rank trainings) join them, first,
    so that their waiting overlaps the rehearsals' work. When the two halves' times drift apart
    (each pytest process reports its own), move a test between them here."""
    items.sort(key=_balanced_first)  # stable: the rest keep their order
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if ("smoke_dag" in getattr(item, "fixturenames", ()) or params.get("rehearsal") in ("tiny.yaml", "paper.yaml", "ladder.yaml")
                or item.nodeid.startswith(BALANCED)):
            item.add_marker(pytest.mark.shared_dag)
            item.add_marker(pytest.mark.slow)  # the rehearsals take minutes: never in the fast tier


BALANCED = ("tests/workflow/test_slurm_cluster.py", "tests/workflow/test_rehearse.py::test_interrupted_rehearsal",
            "tests/workflow/test_dag.py",
            "tests/evaluate/test_eval_command.py::test_lm_evals_tasks_found_by_scan_as_by_its_whole_index",
            "tests/test_benchmarks.py",
            "tests/train/test_fsdp.py", "tests/workflow/test_offline.py::test_the_paper_rehearsal_prefetches_into_empty_caches",
            "tests/train/test_compile_train.py")


def _balanced_first(item) -> int:
    """The tests of BALANCED first, in its order; then the others."""
    return next((i for i, prefix in enumerate(BALANCED) if item.nodeid.startswith(prefix)), len(BALANCED))
