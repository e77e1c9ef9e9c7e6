"""``stateloop train --config C RUN --data-dir DIR [--out DIR] [--set section.key=value ...]``

Trains one run with Lightning Fabric and leaves its folder with config.yaml, checkpoints/,
model.safetensors and train.json. RUN, as in every command that addresses runs
(runs.resolve_run_arg), is a run id, whose folder is ``results/runs/<run id>``, or an existing
run folder ``<...>/runs/<run id>``, whose last three components are the run id; ``--out``
trains into another folder (a new folder elsewhere: the run id and ``--out DIR``). The run id's
seed replaces ``train.seed``. Rerunning the same command resumes from the newest complete
checkpoint; a changed model or optimiser setting (``train.lr``, ...: a resume would keep the old
one) is refused, or with ``--restart-on-change`` (which the DAG passes: Snakemake reruns a job
whose settings changed) starts the run afresh, saying so. Everything is checked before training starts: a malformed RUN, unknown or mistyped
keys, a missing or empty data folder, a tokenizer vocabulary larger than ``model.vocab_size``;
each fails with a one-line message naming the argument, key or file (exit 2). A token shard is
read in full against meta.json's sha256 on its first open, then trusted while its stamp matches
(stateloop/data/shards.py); ``--verify-shards`` reads every shard again.

Exit status: 0 finished; 2 config/data error; 3 non-finite loss (the last good checkpoint is
kept); 75 (EX_TEMPFAIL) stopped by SIGTERM/SIGUSR1 after writing a checkpoint: requeue or rerun.
Inside a SLURM job, SIGUSR1 (SLURM's warning before the time limit, ``--signal=USR1@N``) also
requeues the job, which then resumes by itself with a fresh time limit (slurm.py).
"""

from __future__ import annotations

from stateloop.ops.memory import gate_run
from stateloop.train import stage

Request = stage.Request


def run(request: Request) -> int:
    gate_run(request.config, request.run)  # a run that cannot fit its GPUs is refused before anything starts
    return stage.train_stage(request)
