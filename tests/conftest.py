import pytest
import torch

from stateloop.evaluate.tasks.files import default_shared_data


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
    with one torch thread; tests/workflow/conftest.py starts both rehearsals at once.
    With warm starts (stateloop/ops/warm.py) the rehearsals' half took 16.1 minutes in a fresh-clone
    CI (2026-12-03) against 28.8 for the other, so the tests of :data:`BALANCED` run beside the
    rehearsals too: the SLURM cluster's (about 4 minutes, mostly waiting on the scheduler) and the
    interrupted rehearsal (a DAG of its own, about 1.5 minutes). They go first, so that their
    waiting overlaps the rehearsals' work instead of following it. Then the DAG plans of test_dag.py
    (about 4 CPU-minutes of Snakemake dry runs): once the SLURM rehearsal's jobs are served warm too,
    the rehearsals' half is the lighter one (2026-12-04). With torch-free Snakefile parses it was
    16.5 minutes against 17.8, so lm-eval's whole task index (the one test that builds it, about
    40 s) moved here too, and ladder.yaml's rehearsal (about 1.7 minutes). On 2026-12-04 (evening)
    the other half was the longer by 75 s (19.1 against 17.8 minutes), so the benchmark scripts'
    tests (about 15 s, the GPU check's rehearsal among them) run here as well. On 2026-12-06 the
    other half was the longer by about 7 minutes (21.6 against 14.0, both slowed by other work), so
    the four-rank kill-and-resume trainings of tests/train/test_fsdp.py (about 3 minutes) moved here."""
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
            "tests/train/test_fsdp.py::test_the_papers_strategy_trains_is_killed_resumes_bitwise_then_evaluates_and_exports")


def _balanced_first(item) -> int:
    """The tests of BALANCED first, in its order; then the others."""
    return next((i for i, prefix in enumerate(BALANCED) if item.nodeid.startswith(prefix)), len(BALANCED))
