"""``stateloop train --config C RUN --data-dir DIR [--out DIR] [--set section.key=value ...]``

Trains one run with Lightning Fabric and leaves its folder with config.yaml, checkpoints/,
model.safetensors and train.json (RUN: runs.resolve_run_arg; its seed replaces ``train.seed``).
Rerunning resumes from the newest complete checkpoint; a changed model or optimiser setting is
refused, or with ``--restart-on-change`` (the DAG passes it) starts the run afresh, saying so.
Everything is checked before training starts, each failure one line (exit 2);
``--verify-shards`` reads every token shard against its sha256 again (data/shards.py).

Exit status: 0 finished; 2 config/data error; 3 non-finite loss (the last good checkpoint is
kept); 75 (EX_TEMPFAIL) stopped by SIGTERM/SIGUSR1 after writing a checkpoint: requeue or rerun.
Inside a SLURM job, SIGUSR1 (SLURM's warning before the time limit, ``--signal=USR1@N``) also
requeues the job, which then resumes by itself with a fresh time limit (train/slurm.py).
"""

from __future__ import annotations

from stateloop.ops.cluster import check_cluster_file
from stateloop.ops.measured import keep_flop_counts
from stateloop.ops.memory import gate_run
from stateloop.train import stage

Request = stage.Request


def run(request: Request) -> int:
    check_cluster_file(request.config)  # its jobs' runtimes, SLURM's warning and dist_timeout_s fit the cluster
    gate_run(request.config, request.run)  # a run that cannot fit its GPUs is refused before anything starts
    keep_flop_counts()  # the MFU's FLOP count: counted once per shape, across processes too
    return stage.train_stage(request)
