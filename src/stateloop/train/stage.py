"""``stateloop train``'s stage: resolve the run's config (resolve.resolve_run), train it (train/loop.py)
and turn how it ended into the command's exit status (commands/train.py lists them). What it is asked
for is a :class:`Request`, which commands/train.py builds from the flags."""

from __future__ import annotations

import contextlib
import os
import sys

from stateloop import resolve
from stateloop.config import Bool, ConfigError, StageRequest, Text, arg
from stateloop.data import hub
from stateloop.data.shards import reverify
from stateloop.evaluate.tasks.needs import task_needs
from stateloop.experiments import find_run, load_checked
from stateloop.run_ids import RUN_HELP, RUN_ID_FORM
from stateloop.runs import resolve_run_arg
from stateloop.train import signals, slurm


class Request(StageRequest):
    """One training as asked for (``stateloop train``'s flags): the run, its config and data, and
    how the training reports and reacts to a changed config."""

    config: Text = arg("pipeline config (configs/*.yaml)")
    run: Text = arg(f"{RUN_HELP}; the id's seed replaces train.seed", positional=True, metavar="RUN")
    data_dir: Text | None = arg("token shards (a `stateloop tokenize` output folder with meta.json)", None)
    out: Text | None = arg("run folder (default: RUN's folder, results/runs/{run id} for a run id)", None)
    no_progress: Bool = arg("no progress bar", False)
    restart_on_change: Bool = arg("a changed model or optimiser setting starts the run afresh (its checkpoints and weights "
                                  "are removed) instead of being refused; the DAG passes it", False)
    verify_shards: Bool = arg("read every token shard in full against meta.json's sha256 again, also those stamped as "
                              "verified (the stamps trust a file whose size, times and inode are unchanged)", False)
    overrides: list[Text] = arg("override a resolved value: train.lr=1e-3 train.max_steps=20 model.norm_eps=1e-6 data.dir=...",
                               [], name="--set", metavar="SECTION.KEY=VALUE")


def require_eval_data(config_path: str, run_id: str) -> None:
    """Offline (HF_HUB_OFFLINE=1: the DAG's SLURM jobs), in the first task only: the data of the
    lm-eval tasks that this run's evaluation will score must be in the caches before the training
    starts, not found missing by the evaluation after it (data/hub.py)."""
    if any(os.environ.get(var, "0") != "0" for var in ("SLURM_PROCID", "LOCAL_RANK", "RANK")):
        return
    if not hub.offline():
        return
    pipeline = load_checked(config_path, expand=False)[0]
    run = find_run(pipeline, run_id)
    if run is None or not (run.scores_tasks() or run.scores_tasks(depths=True)):
        return
    ev = pipeline.scales[run.scale].eval
    hub.require(task_needs(ev.tasks, ev, f"scales.{run.scale}.eval"), config_path)


def train_stage(args: Request) -> int:
    """Train the run ``args`` asks for; returns the exit status (commands/train.py lists them)."""
    # First, before the heavy imports: from here on a SIGUSR1 (SLURM's warning) is kept for the
    # training loop instead of ending the process, and the signals that stop training are known.
    with reverify() if args.verify_shards else contextlib.nullcontext(), signals.SignalLog() as received:
        # here, not above: torch and Lightning take seconds to import, and a SIGUSR1 meanwhile is kept
        from stateloop.train.loop import NONFINITE_EXIT, REQUEUE_EXIT, NonFiniteLoss, train  # lazy: torch

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
