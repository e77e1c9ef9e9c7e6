"""Fixed start-up cost of a job: imports and MLflow store set-up, each in a fresh process.

Every DAG job is a new Python process, so it pays its imports and, for training, opening the
MLflow store, before any work. Each item below runs in its own subprocess (interleaved over the
repeats), and its CPU seconds (user + system, from the child's rusage) are printed, median
over repeats. CPU seconds, not wall time, so other load on the machine moves
the figures little.

With the jobs (not ``--no-job``), each whole job is also run as a local DAG runs it with a warm
server (stateloop/ops/warm.py): its CPU seconds are the command's own process plus the server's child
that ran it (from the server's log), the server's one-off imports not included (printed apart).

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
import time

STORE = """
import sys
from stateloop.tracking import store
store.client(f"sqlite:///{sys.argv[1]}").search_experiments(max_results=1)
"""

OPTIMIZER = "import torch; torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())"

ITEMS = {  # label -> python code run with `python -c`
    "python + torch": "import torch",
    # torch.optim.Optimizer.__init__ goes through torch._disable_dynamo, whose first call imports
    # torch._dynamo (and sympy): every torch training process pays this, with Fabric or without
    "python + torch + one AdamW (imports torch._dynamo)": OPTIMIZER,
    "python + torch + one AdamW + lightning_fabric": OPTIMIZER + "; import lightning_fabric",
    "lightning_fabric": "import lightning_fabric",
    "mlflow": "import mlflow",
    "stateloop.train.loop (the train command's module)": "import stateloop.train.loop",
    "stateloop.report.tables (every render job)": "import stateloop.report.tables",
    "stateloop.ops.bench_decode (the bench job)": "import stateloop.ops.bench_decode",
    "load configs/tiny.yaml (every job; its test_time_K checked)":
        "from stateloop.experiments import load_pipeline; load_pipeline('configs/tiny.yaml')",
    "MLflow client on a new sqlite store (creates, migrates)": STORE,
    "MLflow client on an existing sqlite store": STORE,
}


def run(argv: list[str], env: dict | None = None) -> float:
    """CPU seconds of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


JOB = "a whole `stateloop train` job of 1 step (tiny run, existing store)"
JOB_OFF = "the same job with train.mlflow_tracking=false (no MLflow)"
JOB_WARM = "the train job of 1 step, served by a warm server"
EVAL = "a whole `stateloop eval` job (held-out PPL of 2 windows, no task, MLflow)"
EVAL_WARM = "the eval job, served by a warm server"


def train_job(tmp: str, rep: int, name: str, *overrides: str) -> list[str]:
    """The DAG's training command for one step of a tiny run, in its own folder, against the
    store of the store rows (created by then)."""
    return [sys.executable, "-m", "stateloop.cli", "train", "--config", "configs/tiny.yaml", "tiny/stateloop/K4_ds64_seed1234",
            "--data-dir", os.path.join(tmp, "data"), "--out", os.path.join(tmp, f"{name}{rep}"), "--no-progress",
            "--set", "train.max_steps=1", "train.val_tokens=2048", f"train.mlflow_tracking_uri=sqlite:///{tmp}/mlflow{rep}.db",
            *overrides]


def eval_job(tmp: str, rep: int) -> list[str]:
    """The DAG's eval command for the run ``train_job(tmp, rep)`` trained, perplexity only."""
    return [sys.executable, "-m", "stateloop.cli", "eval", os.path.join(tmp, f"run{rep}"), "--config", "configs/tiny.yaml",
            "--tasks", "--no-progress", "--set", "eval.heldout_windows=2"]


def served(argv: list[str], log: str) -> float:
    """CPU seconds of ``argv`` served by the warm server logging to ``log``: the command's process
    plus the child that ran it."""
    before = open(log).read().count(" ended: ")
    own = run(argv)
    for _ in range(600):
        ended = [line for line in open(log).read().splitlines() if " ended: " in line]
        if len(ended) > before:
            return own + float(ended[-1].rsplit(", ", 1)[1].split()[0])
        time.sleep(0.1)
    raise RuntimeError(f"the warm server did not serve {argv[3:5]} (see {log})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-job", action="store_true", help="skip the two whole training jobs (they tokenize the tiny corpus first)")
    args = ap.parse_args()
    items = list(ITEMS) + ([] if args.no_job else [JOB, JOB_OFF, JOB_WARM, EVAL, EVAL_WARM])
    cpu = {k: [] for k in items}
    server, log = None, None
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_job:
            subprocess.run([sys.executable, "-m", "stateloop.cli", "tokenize", "--config", "configs/tiny.yaml", "--scale", "tiny",
                            "--out", os.path.join(tmp, "data"), "--no-progress"], check=True, stdout=subprocess.DEVNULL)
            from stateloop.ops import warm

            log = os.path.join(tmp, "warm.log")
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow-eval.db"  # eval's store (train's is named)
            server = warm.start(log)
            cold_env = {k: v for k, v in os.environ.items() if k != warm.ENV}
        for rep in range(args.repeats):
            db = os.path.join(tmp, f"mlflow{rep}.db")
            for label, code in ITEMS.items():  # the new store's item comes first and creates db
                cpu[label].append(run([sys.executable, "-c", code, *((db,) if code is STORE else ())], cold_env if server else None))
            if not args.no_job:
                cpu[JOB].append(run(train_job(tmp, rep, "run"), cold_env))
                cpu[JOB_OFF].append(run(train_job(tmp, rep, "off", "train.mlflow_tracking=false"), cold_env))
                cpu[JOB_WARM].append(served(train_job(tmp, rep, "warm"), log))
                cpu[EVAL].append(run(eval_job(tmp, rep), cold_env))
                cpu[EVAL_WARM].append(served(eval_job(tmp, rep), log))
        if server:
            warm.stop(server)
            print(open(log).read().splitlines()[0])
    print(f"{sys.executable}; {args.repeats} repeats, median CPU seconds (user + system) of a fresh process; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'what':<58} {'CPU s':>7}")
    for label in items:
        print(f"{label:<58} {statistics.median(cpu[label]):>7.2f}")
    print("(each row includes starting Python; the store rows include importing mlflow and stateloop.tracking)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
