"""Fixed start-up cost of a job: imports and MLflow store set-up, each in a fresh process.

Every DAG job is a new Python process, so it pays its imports and, for training, opening the
MLflow store, before any work. Each item below runs in its own subprocess (interleaved over the
repeats), and its CPU seconds (user + system, from the child's rusage) are printed, median
over repeats. CPU seconds, not wall time, so other load on the machine moves
the figures little.

    PYTHONPATH=src python benchmarks/bench_startup.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile

STORE = """
import sys
from stateloop import tracking
tracking.client(f"sqlite:///{sys.argv[1]}").search_experiments(max_results=1)
"""

ITEMS = {  # label -> python code run with `python -c`
    "python + torch": "import torch",
    "lightning_fabric": "import lightning_fabric",
    "mlflow": "import mlflow",
    "stateloop.train.loop (the train command's module)": "import stateloop.train.loop",
    "stateloop.report.tables (every render job)": "import stateloop.report.tables",
    "stateloop.analysis.latency (the bench job)": "import stateloop.analysis.latency",
    "load configs/tiny.yaml (every job; its test_time_K checked)":
        "from stateloop.experiments import load_pipeline; load_pipeline('configs/tiny.yaml')",
    "MLflow client on a new sqlite store (creates, migrates)": STORE,
    "MLflow client on an existing sqlite store": STORE,
}


def run(code: str, *args: str) -> float:
    """CPU seconds of one fresh ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cpu = {k: [] for k in ITEMS}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            db = os.path.join(tmp, f"mlflow{rep}.db")
            for label, code in ITEMS.items():  # the new store's item comes first and creates db
                cpu[label].append(run(code, *((db,) if code is STORE else ())))
    print(f"{sys.executable}; {args.repeats} repeats, median CPU seconds (user + system) of a fresh process; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'what':<58} {'CPU s':>7}")
    for label in ITEMS:
        print(f"{label:<58} {statistics.median(cpu[label]):>7.2f}")
    print("(each row includes starting Python; the store rows include importing mlflow and stateloop.tracking)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
