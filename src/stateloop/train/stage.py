"""``stateloop train``'s stage: resolve the run's config (resolve.resolve_run), train it (train/loop.py)
and turn how it ended into the command's exit status (commands/train.py lists them). What it is asked
for is a :class:`Request`, which commands/train.py builds from the flags."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field

from stateloop import prefetch, resolve
from stateloop.config import ConfigError, StageRequest
from stateloop.data.shards import reverify
from stateloop.pipeline import RUN_ID_FORM, load_checked
from stateloop.runs import resolve_run_arg
from stateloop.train import signals, slurm


@dataclass(frozen=True)
class Request(StageRequest):
    """One training as asked for (``stateloop train``'s flags): the run, its config and data, and
    how the training reports and reacts to a changed config."""

    config: str  # the pipeline config (configs/*.yaml) that plans the run
    run: str  # a run id, or a run folder <...>/runs/<run id> (runs.resolve_run_arg)
    data_dir: str | None = None  # token shards (a `stateloop tokenize` folder); None: the config's data.dir
    out: str | None = None  # run folder to train into; None: RUN's folder
    overrides: list[str] = field(default_factory=list)  # SECTION.KEY=VALUE over the resolved config (--set)
    no_progress: bool = False
    restart_on_change: bool = False  # a changed model or optimiser setting starts afresh instead of being refused
    verify_shards: bool = False  # read every token shard against meta.json's sha256 again, stamped or not


def require_eval_data(config_path: str, run_id: str) -> None:
    """Offline (HF_HUB_OFFLINE=1: the DAG's SLURM jobs), in the first task only: the data of the
    lm-eval tasks that this run's evaluation will score must be in the caches before the training
    starts, not found missing by the evaluation after it (stateloop/prefetch.py)."""
    if any(os.environ.get(var, "0") != "0" for var in ("SLURM_PROCID", "LOCAL_RANK", "RANK")) or not prefetch.offline():
        return
    pipeline, runs = load_checked(config_path)
    run = runs.get(run_id)
    if run is None or not (run.scores_tasks() or run.scores_tasks(depths=True)):
        return
    ev = pipeline.scales[run.scale].eval
    prefetch.require(prefetch.task_needs(ev.tasks, ev, f"scales.{run.scale}.eval"), config_path)


def train_stage(args: Request) -> int:
    """Train the run ``args`` asks for; returns the exit status (commands/train.py lists them)."""
    # First, before the heavy imports: from here on a SIGUSR1 (SLURM's warning) is kept for the
    # training loop instead of ending the process, and the signals that stop training are known.
    with reverify() if args.verify_shards else contextlib.nullcontext(), signals.SignalLog() as received:
        # here, not above: torch and Lightning take seconds to import, and a SIGUSR1 meanwhile is kept
        from stateloop.train.loop import NONFINITE_EXIT, REQUEUE_EXIT, NonFiniteLoss, train

        run = resolve_run_arg(args.run)
        if run.id is None:
            raise ConfigError(f"RUN: {args.run}: a run folder to train must be <...>/runs/{RUN_ID_FORM} (its last "
                              f"three components are the run id); or give the run id and --out DIR")
        config = resolve.resolve_run(args.config, run.id, args.overrides, args.data_dir)
        slurm.warn_cpu_fallback(config.train.accelerator)
        require_eval_data(args.config, run.id)
        out = args.out or str(run.folder)
        try:
            result = train(config, out, progress=not args.no_progress, restart=args.restart_on_change)
        except NonFiniteLoss as err:
            print(f"stateloop train: error: {err}", file=sys.stderr)
            return NONFINITE_EXIT
    if result.status == "interrupted":
        # Every rank has saved the checkpoint (its write ends at a barrier). Only rank 0 reports 75:
        # under Fabric's own launcher the job's status is the launching process's (rank 0), and
        # Fabric's child-process observer SIGKILLs rank 0 when a child exits non-zero before it;
        # under `srun --kill-on-bad-exit=1` (the train rule's launcher) a task's non-zero exit ends
        # the step, which would stop rank 0 before it requeues the job. srun passes rank 0's 75 on.
        if result.rank0:
            signals.requeue_after_warning(received, result.step)
        return REQUEUE_EXIT if result.rank0 else 0
    s = result.summary
    if result.rank0:
        losses = "".join(f", {name} loss {s[key]:.4f}" for name, key in (("train", "final_train_loss"), ("val", "final_val_loss"))
                         if s[key] is not None)
        print(f"{s['run']}: {s['steps']} steps, {s['tokens']:,} tokens{losses}, {s['wall_time_s']:.1f} s -> {out}")
    return 0
