"""The run folder's policy: one training holds it (:func:`claim`: a lock, then refusing or, with
``--restart-on-change``, restarting on a changed setting), and which checkpoint resumes the run and
what that resume may change (:func:`resume`). :class:`RunFolder`: the resume point and the progress
saved since. runs.py describes the folder; checkpoint.py writes and verifies its files."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from stateloop.config import ConfigError, load_yaml
from stateloop.files import atomic_write_bytes, safe_torch_load
from stateloop.runs import FINAL_WEIGHTS, RUN_CONFIG, TRAIN_SUMMARY, has_final_weights
from stateloop.train.checkpoint import CheckpointStore, clean_run_folder, collect_rng, restore_rng, warn
from stateloop.train.parallel import is_sharded
from stateloop.train.schedule import lr_at

LOCK = ".lock"  # in the run folder: held (flock) by the training that writes it
# Settings a resumed optimizer and schedule carry in their state: a change would be silently undone.
OPTIMIZER_KEYS = ("lr", "min_lr", "warmup_steps", "schedule", "weight_decay", "betas", "eps")
# What draws the batches. A resume applies a change of these, of COMPUTE_KEYS, of train.grad_clip,
# and of the budget where it changes the lr of the steps still to come (the cosine's length: the lr
# curve is spliced at the resumed step) from its step on, with a warning and a record (train.json's
# inexact_resume, an MLflow tag).
STREAM_KEYS = ("seed", "seq_len", "global_batch")
# How the same batches are computed: the accumulation's micro-batches, the processes that reduce the
# gradient, the arithmetic. A change keeps the tokens, not the bits of an uninterrupted run.
COMPUTE_KEYS = ("micro_batch", "devices", "num_nodes", "precision", "compile")


def primary_process() -> bool:
    """The process that launches a run (Fabric's rank 0 before it starts the others, or the first
    task under srun): the one that holds the run folder's lock."""
    return all(os.environ.get(var, "0") == "0" for var in ("LOCAL_RANK", "RANK", "SLURM_PROCID"))


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold ``run_dir/.lock`` (an exclusive ``flock``, released when the process ends however it
    ends) while training; a second training of the same folder is refused in one line naming the
    holder's pid and host. On NFS, flock is Linux's emulation over the server's locks."""
    if not primary_process():
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = path.read_text().strip() or "another process"
        os.close(fd)
        raise ConfigError(f"{run_dir}: another training holds this run folder ({holder}); "
                          f"wait for it, or train into another --out folder") from None
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        yield
    finally:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def claim(run_dir: Path, config: dict, restart: bool):
    """Check the folder (:func:`check_run_folder`) before anything is written, then hold its lock;
    with ``restart`` a changed setting starts the run afresh: its checkpoints and final weights go."""
    conflict = check_run_folder(run_dir, config, restart)
    with run_lock(run_dir):
        if conflict and primary_process():
            warn(f"{conflict}: starting the run afresh (--restart-on-change): removing its checkpoints and final weights")
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            for name in (FINAL_WEIGHTS, TRAIN_SUMMARY):
                (run_dir / name).unlink(missing_ok=True)
        yield


def check_run_folder(run_dir: Path, config: dict, restart: bool = False) -> str | None:
    """One folder holds one run: refuse another run id, a changed model setting, or a changed
    optimiser setting where the run has progress (its checkpoints or final weights would bring the
    old value back). With ``restart`` (``--restart-on-change``, which the DAG's train rule passes: a
    changed setting is why Snakemake reruns the job) such a change is returned instead."""
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    old = load_yaml(path)
    old_id, new_id = (old.get("run") or {}).get("id"), config["run"]["id"]
    if old_id != new_id:
        raise ConfigError(f"{run_dir}: holds run {old_id}, not {new_id}; train into another --out folder")
    conflict, old_model = None, old.get("model") or {}
    if old.get("model") != config["model"]:
        key = _changed(old_model, config["model"])
        conflict = f"model.{key} = {config['model'].get(key)!r} differs from the run's {old_model.get(key)!r} in {path}"
    elif any((run_dir / "checkpoints").glob("*")) or has_final_weights(run_dir):
        key = next((k for k in OPTIMIZER_KEYS if (old.get("train") or {}).get(k) != config["train"].get(k)), None)
        if key is not None:
            before, now = (old.get("train") or {}).get(key), config["train"].get(key)
            conflict = (f"train.{key}: {now!r} differs from {before!r} in {path}, and a resumed optimizer and "
                        f"schedule would keep {before!r}")
    if conflict is not None and not restart:
        raise ConfigError(f"{run_dir}: {conflict}; restore it, train into another --out folder, or pass "
                          f"--restart-on-change to start the run afresh")
    return conflict


@dataclass
class RunFolder:
    """The run folder as training writes it: its checkpoints, what they hold (``state``: the modules,
    step, tokens, RNG, train loss, validation curve, config, data identity), the one resumed, the
    last one written."""

    dir: Path
    store: CheckpointStore
    state: dict
    resumed: str | None = None
    inexact: list[str] = field(default_factory=list)  # why the resumed steps differ from an uninterrupted run's
    saved_at: int | None = None  # the step of the last good checkpoint: written or resumed from
    t0: float = 0.0  # perf_counter() when the run began training, earlier attempts' seconds included (setup sets it)

    def save(self, fabric, step: int, train_loss: float | None, tokens_per_step: int) -> Path:
        self.state.update(step=step, tokens=step * tokens_per_step, rng=collect_rng(), train_loss=train_loss,
                          elapsed=self.elapsed())
        return self.store.save(fabric, self.state, step)

    def elapsed(self) -> float:
        """Training seconds over every attempt of the run."""
        return time.perf_counter() - self.t0


def latest(fabric, store: CheckpointStore, run_dir: Path) -> str | None:
    """The newest complete checkpoint (rank 0 reports each broken newer one, then removes what
    interrupted writes left), on every rank."""
    path = None
    if fabric.is_global_zero:
        path = store.latest()
        store.clean_leftovers()
        clean_run_folder(run_dir)
    return fabric.broadcast(str(path) if path else None, src=0)


def resume(fabric, store: CheckpointStore, path: str | None, state: dict, run_dir: Path) -> RunFolder:
    """Load checkpoint ``path`` (None: a fresh run) into ``state`` once its settings are checked
    (:func:`check_resume`), then write config.yaml: a refused resume records nothing."""
    config, data = state["config"], state["data"]
    inexact = []
    if path:
        if is_sharded(fabric):
            # FSDP resumes an optimizer state keyed by parameter name (what an FSDP run writes). One
            # process and DDP key it by position in the optimizer's groups, which Fabric re-keys in
            # model.parameters() order, not the groups' (decayed matrices first): the moments would land on
            # the wrong parameters. (An FSDP checkpoint resumed by one process or DDP is read in the groups' order.)
            saved = (safe_torch_load(path, mmap=True, legacy_numpy=True).get("optimizer") or {}).get("state") or {}
            if any(isinstance(k, int) for k in saved):
                raise ConfigError(f"{path}: written by one process or DDP, and train.strategy fsdp cannot resume its "
                                  f"optimizer state (keyed by position); resume with train.strategy ddp, or train into "
                                  f"another --out folder")
        extra = store.load_into(fabric, path, state)  # torch's safe unpickler: a checkpoint never runs code
        # The validation points up to the checkpoint's step (checkpoints before the curve was kept have none).
        state["val_curve"] = [p for p in extra.get("val_curve", []) if p["step"] <= state["step"]]
        inexact = check_resume(path, state["config"], config, state["data"], data, state["step"])
        restore_rng(state["rng"])
        state.update(data=data, config=config)
        if fabric.is_global_zero:
            warn(f"resuming from {path} (step {state['step']} of {_total_steps(config['train'])}, "
                 f"{state['tokens']:,} tokens seen)")
    if fabric.is_global_zero:
        atomic_write_bytes(run_dir / RUN_CONFIG, yaml.safe_dump(config, sort_keys=False).encode())
    state.setdefault("val_curve", [])  # after loading: fabric.load refuses a key an older checkpoint lacks
    return RunFolder(run_dir, store, state, path, inexact, saved_at=state["step"] if path else None)


def _total_steps(train: dict) -> int:
    """TrainConfig.total_steps of a saved ``train`` section."""
    if train.get("max_tokens"):
        return train["max_tokens"] // (train["global_batch"] * train["seq_len"])
    return int(train.get("max_steps") or 0)


def check_resume(path, saved: dict, current: dict, saved_data: dict | None, data: dict, step: int) -> list[str]:
    """A checkpoint resumes only the model and optimiser settings it holds (a folder copied without
    its config.yaml is checked here); every other change it applies is warned about and returned
    (the run records it: the steps after the resume differ from an uninterrupted run's)."""
    name, was, now = Path(path).name, saved["train"], current["train"]
    if saved.get("model") != current["model"]:
        raise ConfigError(f"{path}: model.{_changed(saved.get('model', {}), current['model']) or '?'} differs from "
                          f"the checkpoint's config; train into a new --out folder")
    for key in (k for k in OPTIMIZER_KEYS if k in was and was[k] != now.get(k)):  # the keys the checkpoint records
        raise ConfigError(f"train.{key}: {now.get(key)!r} differs from {was[key]!r} in {path}, and a resumed optimizer "
                          f"and schedule would keep {was[key]!r}; restore it, or train into another --out folder")
    stream, changes = "the resumed batch stream differs from an uninterrupted run's", []
    old_print = (saved_data or {}).get("fingerprint")
    if old_print and old_print != data["fingerprint"]:
        changes.append(f"the {data['split']!r} tokens in {data['dir']} changed since {name} ({saved_data.get('tokens')} "
                       f"-> {data['tokens']} tokens, shards {old_print} -> {data['fingerprint']}): {stream}")
    old_stream = (saved_data or {}).get("stream", "uniform-starts")
    if old_stream != data["stream"]:
        changes.append(f"{name} was trained on the {old_stream!r} batch stream, this code draws {data['stream']!r}: {stream}")
    effects = {**dict.fromkeys(STREAM_KEYS, stream), **dict.fromkeys(COMPUTE_KEYS, (
        f"the steps from {step} on compute the same batches another way, not bitwise as an uninterrupted run would")),
        "grad_clip": f"the steps from {step} on clip at the new value"}
    for key, effect in effects.items():  # a compute key the checkpoint does not record is not compared
        if was.get(key) != now.get(key) and (key in was or key not in COMPUTE_KEYS):
            changes.append(f"train.{key} changed since {name} ({was.get(key)} -> {now.get(key)}): {effect}")
    old_total, new_total = _total_steps(was), _total_steps(now)

    def lr(s: int, total: int) -> float:  # lr, min_lr, warmup_steps and schedule: the checkpoint's (checked above)
        return lr_at(s, now["lr"], now["min_lr"], now["warmup_steps"], total, now["schedule"])

    if old_total != new_total and any(lr(s, old_total) != lr(s, new_total) for s in range(step, min(old_total, new_total))):
        changes.append(f"the budget changed since {name} ({old_total} -> {new_total} steps; train.max_tokens, train.max_steps): "
                       f"the lr schedule is spliced at step {step} (it follows the new budget from there)")
    for line in changes:
        warn(line)
    return changes


def _changed(old: dict, new: dict) -> str | None:
    """The first key (in sorted order) whose value differs."""
    return next((k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)), None)
