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
each fails with a one-line message naming the argument, key or file (exit 2).

Exit status: 0 finished; 2 config/data error; 3 non-finite loss (the last good checkpoint is
kept); 75 (EX_TEMPFAIL) stopped by SIGTERM/SIGUSR1 after writing a checkpoint: requeue or rerun.
Inside a SLURM job, SIGUSR1 (SLURM's warning before the time limit, ``--signal=USR1@N``) also
requeues the job, which then resumes by itself with a fresh time limit (train/slurm.py).
"""

from __future__ import annotations

import os
import sys

from stateloop.commands import RUN_HELP


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="pipeline config (configs/*.yaml)")
    p.add_argument("run", metavar="RUN", help=f"{RUN_HELP}; the id's seed replaces train.seed")
    p.add_argument("--data-dir", help="token shards (a `stateloop tokenize` output folder with meta.json)")
    p.add_argument("--out", help="run folder (default: RUN's folder, results/runs/{run id} for a run id)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--restart-on-change", action="store_true",
                   help="a changed model or optimiser setting starts the run afresh (its checkpoints and weights are "
                        "removed) instead of being refused; the DAG passes it")
    p.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a resolved value: train.lr=1e-3 train.max_steps=20 model.norm_eps=1e-6 data.dir=...")


def run(args) -> int:
    from stateloop.train import signals, slurm

    # First, before the heavy imports: from here on a SIGUSR1 (SLURM's warning) is kept for the
    # training loop instead of ending the process, and the signals that stop training are known.
    with signals.SignalLog() as received:
        from stateloop.config import ConfigError
        from stateloop.pipeline import resolve_run
        from stateloop.runs import RUN_ID_FORM, resolve_run_arg
        from stateloop.train.loop import NONFINITE_EXIT, REQUEUE_EXIT, NonFiniteLoss, train

        run = resolve_run_arg(args.run)
        if run.id is None:
            raise ConfigError(f"RUN: {args.run}: a run folder to train must be <...>/runs/{RUN_ID_FORM} (its last "
                              f"three components are the run id); or give the run id and --out DIR")
        config = resolve_run(args.config, run.id, args.overrides, args.data_dir)
        slurm.warn_cpu_fallback(config.as_dict())
        out = args.out or str(run.folder)
        try:
            result = train(config, out, progress=not args.no_progress, restart=args.restart_on_change)
        except NonFiniteLoss as err:
            print(f"stateloop train: error: {err}", file=sys.stderr)
            return NONFINITE_EXIT
    if result.status == "interrupted":
        # Under Fabric's own launcher the job's status is the launching process's (rank 0), and
        # Fabric's child-process observer SIGKILLs rank 0 when a child exits non-zero before it:
        # the children it started exit 0. Under srun every task reports 75 and srun passes it on.
        started_by_fabric = not result.rank0 and int(os.environ.get("SLURM_NTASKS", "1") or 1) <= 1
        if result.rank0:
            signals.requeue_after_warning(received, result.step)
        return 0 if started_by_fabric else REQUEUE_EXIT
    s = result.summary
    if result.rank0:
        losses = "".join(f", {name} loss {s[key]:.4f}" for name, key in (("train", "final_train_loss"), ("val", "final_val_loss"))
                         if s[key] is not None)
        print(f"{s['run']}: {s['steps']} steps, {s['tokens']:,} tokens{losses}, {s['wall_time_s']:.1f} s -> {out}")
    return 0
