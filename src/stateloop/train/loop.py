"""The training loop: Lightning Fabric, AdamW, warmup + cosine, accumulation, exact resume.

``train(config, run_dir)`` trains one run from its resolved config (resolve.resolve_run) and
leaves in ``run_dir``: config.yaml, checkpoints/, mlflow.json, model.safetensors and train.json
(runs.py describes the folder). The parts, in litgpt's order: :func:`setup` -> :func:`fit` -> :func:`finish`:

- setup: Fabric from ``train.{accelerator, devices, num_nodes, strategy, precision}``. Outside
  SLURM on one node: LightningEnvironment (Fabric spawns ``devices`` processes). In a SLURM job
  every geometry runs under srun, one task per device (workflow/rules/common.smk, ``launcher``):
  one task uses LightningEnvironment, several SLURMEnvironment, ranks from SLURM. The model is
  built from the seed, the optimizer and LambdaLR schedule beside it; the newest complete
  checkpoint (checkpoint.py), when there is one, overwrites all of it.
- fit: optimiser step s (0-based) reads ``accumulation`` micro-batches per device from
  ``TokenSampler`` (batch = f(seed, s, rank, micro)), backward without gradient sync except on the
  last micro-batch, clips the global gradient norm, checks that loss and norm are finite on every
  rank (one small all-reduce that also carries the stop request of a signal), steps AdamW and
  the schedule. The loss of a micro-batch is the mean next-token cross-entropy divided by the
  accumulation count, so the summed gradient is that of the mean over the global batch.
- finish: validate (mean next-token NLL over the first ``val_tokens`` of the held-out split,
  evaluate/perplexity.py, windows split over ranks and summed), the final checkpoint, model.safetensors
  and train.json. Every validation (each ``val_every`` steps and the last step) is a point of the
  run's validation curve, ``val_curve`` in train.json ({step, tokens, loss}; checkpoints carry the
  points so far); ``val_windows`` there says which windows: the first ones of the split, the same
  for every run of a scale, with their sha256 (the report checks that compared runs share them).
  :class:`Progress` reports every log window (bar or lines, tokens/s, MFU, MLflow).

Exit paths:
- finished: final checkpoint, model.safetensors (runs.save_final, resolved config inside), train.json;
- SIGTERM / SIGUSR1 / SIGINT (train/signals.py, which owns every signal: what each one means,
  and the SLURM requeue after SLURM's warning): the handler only sets a flag; at the next step
  boundary every rank saves a checkpoint and the command exits with :data:`REQUEUE_EXIT` = 75
  (EX_TEMPFAIL, "try again"): run the same command again (or let the scheduler requeue it) and
  it resumes;
- a non-finite loss or gradient norm: :class:`NonFiniteLoss` names the step before the optimiser
  moves; the last good checkpoint stays as it is.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import math
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from stateloop.config import ConfigError, load_yaml
from stateloop.data.check import open_data
from stateloop.evaluate.perplexity import heldout_windows, token_nll
from stateloop.files import atomic_write_bytes, atomic_write_json, code_version
from stateloop.models.registry import build_model
from stateloop.pipeline import RunConfig, upgrade_saved
from stateloop.runs import (
    FINAL_WEIGHTS,
    LEGACY_WEIGHTS,
    MLFLOW_FILE,
    RUN_CONFIG,
    TRAIN_SUMMARY,
    has_final_weights,
    resolve_device,
    save_final,
)
from stateloop.tracking.records import flatten, log_datasets
from stateloop.tracking.store import tracking_uri
from stateloop.tracking.tracker import Tracker
from stateloop.train.checkpoint import CheckpointStore, clean_run_folder, collect_rng, direct_checkpoint_io, restore_rng, warn
from stateloop.train.checkpointing import apply_checkpointing
from stateloop.train.flops import flops_per_sequence, peak_flops
from stateloop.train.loss import lm_loss
from stateloop.train.parallel import fsdp_strategy, full_state_dict, is_sharded, local
from stateloop.train.sampler import STREAM, TokenSampler
from stateloop.train.schedule import lr_at, lr_lambda
from stateloop.train.signals import REQUEUE_EXIT, StopRequest

NONFINITE_EXIT = 3  # the loss or gradient norm became NaN/inf
# Without a progress bar (--no-progress: the DAG's logs, SLURM's output files) a line with step,
# tokens, loss, tok/s and ETA goes to stderr at the first log step, then every this many seconds
# (at a log step), and at the last step.
PROGRESS_EVERY_S = 60.0


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm became NaN or infinite; the message names the step."""


@dataclass
class TrainResult:
    status: str  # "finished" | "interrupted"
    step: int
    summary: dict = field(default_factory=dict)
    checkpoint: Path | None = None
    rank0: bool = True  # False in the other processes of a multi-device run (they print nothing)


# ----------------------------------------------------------------------------------------------
# Setup


def build_fabric(tcfg):
    """Fabric from the ``train`` section (see the module docstring for the cluster environment)."""
    import lightning_fabric as L
    from lightning_fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

    accelerator = resolve_device().type if tcfg.accelerator == "auto" else tcfg.accelerator
    precision = tcfg.precision
    if precision == "auto":
        precision = "bf16-mixed" if accelerator in ("cuda", "gpu") else "32-true"
    world = tcfg.world_size
    slurm_tasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    env = SLURMEnvironment(auto_requeue=False) if slurm_tasks > 1 else LightningEnvironment()
    timeout = datetime.timedelta(seconds=tcfg.dist_timeout_s)  # every collective's, the rendezvous' too
    if world == 1:
        strategy = "auto"
    elif tcfg.strategy == "ddp":
        from lightning_fabric.strategies import DDPStrategy

        strategy = DDPStrategy(cluster_environment=env, checkpoint_io=direct_checkpoint_io(), timeout=timeout)
    else:
        strategy = fsdp_strategy(tcfg, env, timeout)  # train/parallel.py: FSDP2, applied from outside
    plugins = [env, direct_checkpoint_io()] if world == 1 else []
    fabric_precision = precision
    if precision == "64-true" and world > 1 and tcfg.strategy == "fsdp":
        # Fabric's connector refuses the name with FSDP2 (it has no float64 tests), not the plugin:
        # float64 is how the tests compare a sharded run with one process to rounding (tests/train/test_fsdp.py)
        from lightning_fabric.plugins import DoublePrecision

        plugins, fabric_precision = [DoublePrecision()], None
    fabric = L.Fabric(accelerator=accelerator, devices=tcfg.devices, num_nodes=tcfg.num_nodes, strategy=strategy,
                      precision=fabric_precision, plugins=plugins or None)
    return fabric, precision


def decaying(model: torch.nn.Module) -> set[str]:
    """The names of the parameters AdamW decays: matrices (linear weights, embeddings) only, not
    norms, biases, or the state's A_log / b_Delta vectors [choice: the paper does not say which
    tensors decay], nor tensors a model flags ``_no_weight_decay`` (Parcae's B and C, as its recipe
    says). Read before sharding: FSDP replaces the parameters, and their flags with them."""
    return {n for n, p in model.named_parameters() if p.ndim >= 2 and not getattr(p, "_no_weight_decay", False)}


def configure_optimizer(model: torch.nn.Module, tcfg, fused: bool, decay: set[str] | None = None) -> torch.optim.AdamW:
    """AdamW over ``model``'s parameters, weight decay on those named in ``decay`` (default: :func:`decaying`)."""
    decay = decaying(model) if decay is None else decay
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in params if n in decay], "weight_decay": tcfg.weight_decay},
              {"params": [p for n, p in params if n not in decay], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), eps=tcfg.eps, fused=fused or None)


# ----------------------------------------------------------------------------------------------
# Validation


@torch.no_grad()
def validate(fabric, model, windows: torch.Tensor, batch_size: int, diagnostics: bool = False) -> tuple[float, dict | None]:
    """Mean next-token NLL over the validation windows of every rank, and with ``diagnostics`` the
    state's per-iteration diagnostics over the same windows (evaluate/diagnostics.py), else None."""
    from stateloop.evaluate import diagnostics as diag

    model.eval()
    local = windows[fabric.global_rank :: fabric.world_size]
    sums = {} if diagnostics else None
    hook = {"diagnostics": sums} if diagnostics else {}
    # Fabric's mixed precision passes a forward's arguments through apply_to_collection, which copies
    # the diagnostics dict (the model would fill the copy): the module itself, under the same autocast.
    # (Under FSDP2 the module is the sharded one; DDP's wrapper has nothing to do without gradients.)
    with fabric.autocast():
        totals = token_nll(model.module, local, batch_size, device=fabric.device, **hook).sum(0).to(fabric.device)
    totals = fabric.all_reduce(totals, reduce_op="sum")
    state = None
    if diagnostics:
        state = diag.summarise(diag.all_reduce(sums, lambda t: fabric.all_reduce(t.to(fabric.device), reduce_op="sum").cpu()))
    model.train()
    return float(totals[0] / totals[1]), state


# ----------------------------------------------------------------------------------------------
# The run


LOCK = ".lock"  # in the run folder: held (flock) by the training that writes it


def _primary_process() -> bool:
    """The process that launches a run (Fabric's rank 0 before it starts the others, or the first
    task under srun): the one that holds the run folder's lock."""
    return all(os.environ.get(var, "0") == "0" for var in ("LOCAL_RANK", "RANK", "SLURM_PROCID"))


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold ``run_dir/.lock`` (an exclusive ``flock``, released when the process ends however it
    ends) while training; a second training of the same folder is refused in one line naming the
    holder's pid and host. On NFS, flock is Linux's emulation over the server's locks."""
    if not _primary_process():
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


def train(config: RunConfig | dict, run_dir: str | Path, progress: bool = True, restart: bool = False) -> TrainResult:
    """Train (or resume) the run of a resolved config (resolve.resolve_run's, or a saved one) in
    ``run_dir``. Call on every rank.

    Every check runs before anything is written; then the launching process holds the run
    folder's lock (:func:`run_lock`) for the whole training: :func:`setup`, :func:`fit`,
    :func:`finish`. ``restart``: see :func:`check_run_folder`."""
    run_config = config if isinstance(config, RunConfig) else RunConfig.read(config)
    config = run_config.as_dict()
    shards = open_data(run_config)  # (train, val): verified once, read by setup
    conflict = check_run_folder(Path(run_dir), config, restart)
    with run_lock(Path(run_dir)):
        if conflict and _primary_process():
            warn(f"{conflict}: starting the run afresh (--restart-on-change): removing its checkpoints and final weights")
            shutil.rmtree(Path(run_dir) / "checkpoints", ignore_errors=True)
            for name in (FINAL_WEIGHTS, LEGACY_WEIGHTS, TRAIN_SUMMARY):
                (Path(run_dir) / name).unlink(missing_ok=True)
        run = setup(run_config, Path(run_dir), shards)
        stop, meter = StopRequest(), Progress(run, progress)
        stop.install()
        status = "FAILED"
        try:
            result = fit(run, stop, meter) or finish(run, meter)
            status = "FINISHED" if result.status == "finished" else "KILLED"
            return result
        finally:
            stop.restore()
            meter.close()
            if run.tracker is not None:
                run.tracker.finish(status)


# ----------------------------------------------------------------------------------------------
# Setup: Fabric, model, optimizer and schedule, resume, data, tracking


@dataclass
class Run:
    """Everything :func:`setup` builds for the step loop and the finish."""

    rc: RunConfig  # the resolved config, typed (``config``: as saved)
    tcfg: object
    run_dir: Path
    fabric: object
    precision: str
    raw_model: torch.nn.Module
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    store: CheckpointStore
    state: dict  # what a checkpoint holds (the objects above, step, tokens, RNG, ...)
    resume: str | None  # the checkpoint resumed from
    sampler: object
    val_windows: torch.Tensor | None
    tracker: object | None  # MLflow (rank 0)
    flops_seq: int | None  # FLOPs of one sequence's forward + backward (MFU), where a peak is known
    peak: float | None
    elapsed_before: float = 0.0  # training seconds of the earlier attempts (from the checkpoint)
    saved_at: int | None = None  # the step of the last good checkpoint: written or resumed from
    val_loss: float | None = None  # the last validation
    inexact: list[str] = field(default_factory=list)  # why the resumed steps differ from an uninterrupted run's
    val_windows_id: dict | None = None  # which windows validation reads (train.json's val_windows)
    t_start: float = field(default_factory=time.perf_counter)

    @property
    def rank0(self) -> bool:
        return self.fabric.is_global_zero

    @property
    def config(self) -> dict:
        """The resolved config as config.yaml and the final weights save it."""
        return self.rc.as_dict()

    def checkpoint(self, step: int, train_loss: float | None) -> Path:
        self.state.update(step=step, tokens=step * self.tcfg.tokens_per_step, rng=collect_rng(), train_loss=train_loss,
                          elapsed=self.elapsed())
        return self.store.save(self.fabric, self.state, step)

    def elapsed(self) -> float:
        """Training seconds over every attempt of the run."""
        return self.elapsed_before + time.perf_counter() - self.t_start


def setup(run_config: RunConfig, run_dir: Path, shards) -> Run:

    config, mcfg, tcfg = run_config.as_dict(), run_config.model, run_config.train
    train_shards, val_shards = shards
    fabric, precision = build_fabric(tcfg)
    fabric.launch()
    if fabric.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
    store = CheckpointStore(run_dir / "checkpoints", tcfg.keep_checkpoints)
    resume = None
    if fabric.is_global_zero:
        resume = store.latest()  # reports each broken newer checkpoint, then:
        store.clean_leftovers()
        clean_run_folder(run_dir)
    resume = fabric.broadcast(str(resume) if resume else None, src=0)

    # -- model, optimizer, schedule ---------------------------------------------------------------
    fabric.seed_everything(tcfg.seed, verbose=False)
    with fabric.init_module():  # in the precision's dtype; under FSDP on the CPU, sharded (and moved) by setup_module
        raw_model = build_model(mcfg)
    apply_checkpointing(raw_model, tcfg.activation_checkpointing)  # its units: training forwards only; before FSDP
    decay = decaying(raw_model)
    model = torch.compile(raw_model) if tcfg.compile else raw_model
    model = fabric.setup_module(model)  # under FSDP, raw_model's parameters are now its shards (in place)
    optimizer = configure_optimizer(raw_model, tcfg, fused=fabric.device.type == "cuda", decay=decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg, tcfg.total_steps))
    optimizer = fabric.setup_optimizers(optimizer)

    # -- resume: the batch stream is a function of (train tokens, seed, step); the checkpoint records which tokens
    data_identity = {"dir": str(train_shards.dir), "split": train_shards.split, "tokens": len(train_shards),
                     "fingerprint": train_shards.fingerprint(), "stream": STREAM}
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0, "tokens": 0,
             "elapsed": 0.0, "rng": None, "mlflow_run_id": None, "config": config, "train_loss": None,
             "data": data_identity}
    inexact: list[str] = []  # what makes the resumed steps differ from an uninterrupted run's
    if resume:
        if is_sharded(fabric):
            refuse_positional_optimizer_state(resume)
        extra = store.load_into(fabric, resume, state)  # torch's safe unpickler: a checkpoint never runs code
        # The validation points up to the checkpoint's step (checkpoints before the curve was kept have none).
        state["val_curve"] = [p for p in extra.get("val_curve", []) if p["step"] <= state["step"]]
        inexact = _check_resume(resume, upgrade_saved(state["config"]), config, state["data"], data_identity, state["step"])
        state["data"] = data_identity
        restore_rng(state["rng"])
        state["config"] = config
        if fabric.is_global_zero:
            warn(f"resuming from {resume} (step {state['step']} of {tcfg.total_steps}, {state['tokens']:,} tokens seen)")
    if fabric.is_global_zero:  # after the resume's checks: a refused resume records nothing
        atomic_write_bytes(run_dir / RUN_CONFIG, yaml.safe_dump(config, sort_keys=False).encode())

    # After loading: a checkpoint written before the curve was kept lacks the key (fabric.load would refuse it).
    state.setdefault("val_curve", [])

    # -- data ---------------------------------------------------------------------------------------
    world = fabric.world_size
    sampler = TokenSampler(train_shards, tcfg.seq_len, tcfg.global_batch, tcfg.micro_batch, world, tcfg.seed)
    val_windows = val_windows_id = None
    if val_shards is not None:
        n = (tcfg.val_tokens // tcfg.seq_len) // world * world  # equal forwards on every rank
        val_windows = heldout_windows(val_shards, tcfg.seq_len, max_windows=max(n, world))
        val_windows = val_windows[: len(val_windows) // world * world]
        if len(val_windows) == 0:
            raise ConfigError(f"{val_shards.dir}/meta.json: split {tcfg.val_split!r} has fewer than one window of "
                              f"{tcfg.seq_len + 1} tokens per process ({world} processes)")
        val_windows_id = windows_identity(val_windows, tcfg.val_split)

    tracker = _tracker(run_config, run_dir, state, inexact) if fabric.is_global_zero and tcfg.mlflow_tracking else None
    if tracker is not None:
        read = {"training": train_shards, **({"validation": val_shards} if val_shards is not None else {})}
        log_datasets(tracker.client, tracker.run_id, run_config.run.scale, read)
    peak = peak_flops(fabric.device, precision, tcfg.peak_tflops)
    flops_seq = None
    if peak:
        try:
            flops_seq = flops_per_sequence(mcfg, tcfg.seq_len)
        except Exception as err:  # noqa: BLE001 - a model the meta-device FLOP counter cannot trace: no MFU
            if fabric.is_global_zero:
                warn(f"no MFU: FLOPs of {mcfg.name} could not be counted on the meta device ({type(err).__name__}: {err})")
    return Run(run_config, tcfg, run_dir, fabric, precision, raw_model, model, optimizer, scheduler, store, state, resume,
               sampler, val_windows, tracker, flops_seq, peak, elapsed_before=state["elapsed"],
               saved_at=state["step"] if resume else None, inexact=inexact, val_windows_id=val_windows_id)


def windows_identity(windows: torch.Tensor, split: str) -> dict:
    """Which held-out windows a validation reads: split, count, length and the sha256 of their
    tokens (as int64), so that runs compared point by point can be checked to share them."""
    import hashlib

    digest = hashlib.sha256(windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()
    return {"split": split, "windows": len(windows), "seq_len": windows.shape[1] - 1, "sha256": digest}


def _tracker(rc: RunConfig, run_dir: Path, state: dict, inexact: list[str]):
    """The run's MLflow run (a resumed run continues the one its checkpoint names; after an inexact
    resume the redone steps are logged again, with their new values)."""

    run, tcfg = rc.run, rc.train
    tags = {"scale": run.scale, "model": run.model, "K": str(run.K), "d_s": str(rc.d_s),
            "code_version": code_version(), "config_file": run.config}
    tracker = Tracker(tracking_uri(tcfg.mlflow_tracking_uri), tcfg.mlflow_experiment, run.id,
                      run_id=state["mlflow_run_id"], tags=tags, previous=run_dir / MLFLOW_FILE, exact=not inexact,
                      system_metrics_s=tcfg.mlflow_system_metrics_s)
    if inexact:
        tracker.client.set_tag(tracker.run_id, "stateloop.inexact_resume", f"from step {state['step']}: {'; '.join(inexact)}"[:5000])
    tracker.log_params(flatten(rc.as_dict()))
    state["mlflow_run_id"] = tracker.run_id
    atomic_write_json(run_dir / MLFLOW_FILE, {"tracking_uri": tracker.uri, "experiment": tcfg.mlflow_experiment,
                                              "run_id": tracker.run_id, "run_name": run.id})
    return tracker


# ----------------------------------------------------------------------------------------------
# Progress: the bar or periodic lines, tokens/s and MFU, MLflow metrics of each log window


class Progress:
    """Rank 0 reports; every rank measures. Tokens/s and MFU of each log window come from
    Lightning's ``Throughput`` over the last two log steps (per device: ``seqs_dev`` sequences of
    ``seq_len`` tokens a step, ``flops_seq`` FLOPs each; the peak: train/flops.py)."""

    def __init__(self, run: Run, progress: bool):
        from lightning_fabric.utilities.throughput import Throughput

        self.run, tcfg = run, run.tcfg
        self.start = self.step_log = run.state["step"]
        self.total = tcfg.total_steps
        self.seqs_dev = tcfg.global_batch // run.fabric.world_size
        self.meter = Throughput(available_flops=run.peak if run.flops_seq else None, world_size=run.fabric.world_size,
                                window_size=2)
        self.meter.update(time=0.0, batches=0, samples=0, lengths=0, flops=0 if run.flops_seq else None)
        self.losses: list[float] = []  # of the steps since the last log
        self.last_loss = run.state["train_loss"]  # mean over the last log window
        self.t_line = -math.inf  # the last progress line (no bar): the first log step prints one
        self.steady = None  # (time, step) at the first log: throughput after warm-up is measured from here
        self.bar = None
        if run.rank0 and progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.start, unit="step", desc=run.rc.run.id,
                            dynamic_ncols=True, file=sys.stderr, mininterval=1.0)

    def step(self, step: int, loss: float, lr: float, grad_norm: float) -> None:
        self.losses.append(loss)
        if self.bar is not None:
            self.bar.update(1)
        if step % self.run.tcfg.log_every == 0 or step == self.total:
            self.log(step, lr, grad_norm)

    def log(self, step: int, lr: float, grad_norm: float) -> None:
        run, tcfg, now = self.run, self.run.tcfg, time.perf_counter()
        done = step - self.start  # steps of this process
        self.meter.update(time=max(now - run.t_start, 1e-9 * done), batches=done, samples=done * self.seqs_dev,
                          lengths=done * self.seqs_dev * tcfg.seq_len,
                          flops=run.flops_seq * (step - self.step_log) * self.seqs_dev if run.flops_seq else None)
        rates = self.meter.compute()  # over this log window (window_size 2)
        tok_s = rates["device/items_per_sec"] * run.fabric.world_size
        metrics = {"train/loss": sum(self.losses) / len(self.losses), "train/lr": lr, "train/grad_norm": grad_norm,
                   "train/tokens_per_s": tok_s, "train/tokens": step * tcfg.tokens_per_step}
        if "device/mfu" in rates:
            metrics["train/mfu"] = rates["device/mfu"]
        self.last_loss = metrics["train/loss"]
        if run.tracker is not None:
            run.tracker.log_metrics(metrics, step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{self.last_loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        elif run.rank0 and (now - self.t_line >= PROGRESS_EVERY_S or step == self.total):
            self.t_line = now
            eta = (self.total - step) * (now - run.t_start) / max(done, 1)
            warn(f"step {step}/{self.total} ({step / self.total:.0%}), {step * tcfg.tokens_per_step:,} tokens, "
                 f"loss {self.last_loss:.4f}, {tok_s:,.0f} tok/s, ETA {_hms(eta)}")
        self.losses.clear()
        self.step_log = step
        self.steady = self.steady or (now, step)

    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s after the first log window, validation and checkpoints included."""
        if self.steady is None or self.total <= self.steady[1]:
            return None
        return (self.total - self.steady[1]) * self.run.tcfg.tokens_per_step / (time.perf_counter() - self.steady[0])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------------
# Fit: the step loop (nanoGPT's order: batch, forward + backward, clip, step, log, evaluate, save)


def fit(run: Run, stop: StopRequest, progress: Progress) -> TrainResult | None:
    """Optimiser steps from the resumed one to the last; a TrainResult only when a signal stopped it."""
    fabric, model, tcfg = run.fabric, run.model, run.tcfg
    world, accum, total = fabric.world_size, tcfg.accumulation, tcfg.total_steps
    model.train()
    for s in range(run.state["step"], total):
        loss_sum = torch.zeros((), device=fabric.device)
        for micro in range(accum):
            x, y = run.sampler.micro_batch_at(s, micro, fabric.global_rank)
            x, y = x.to(fabric.device, non_blocking=True), y.to(fabric.device, non_blocking=True)
            with fabric.no_backward_sync(model, enabled=world > 1 and micro < accum - 1):
                loss = lm_loss(model, x, y, tcfg.loss_chunk_tokens) / accum  # (12), over the global batch
                fabric.backward(loss)
            loss_sum += loss.detach()
        grad_norm = local(fabric.clip_gradients(model, run.optimizer, max_norm=tcfg.grad_clip or float("inf"),
                                                error_if_nonfinite=False))  # FSDP: a replicated DTensor
        # One all-reduce carries the loss, a non-finite flag and a stop request to every rank.
        local_bad = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm.to(loss_sum)))
        flags = torch.stack([loss_sum, local_bad.float(), torch.tensor(float(stop.signal is not None), device=loss_sum.device)])
        if world > 1:
            flags = fabric.all_reduce(flags, reduce_op="sum")
        loss_total, bad, stop_now = flags.tolist()
        if bad > 0:
            last_good = run.store.path(run.saved_at) if run.saved_at is not None else None
            raise NonFiniteLoss(
                f"step {s + 1}: non-finite loss or gradient norm (loss {loss_total / world:.4g}, grad norm "
                f"{float(grad_norm):.4g}); training stopped before the optimizer step; the last good checkpoint "
                f"is {last_good or 'none (no checkpoint was written yet)'}")
        lr_used = run.optimizer.param_groups[0]["lr"]  # eta(s), set by the schedule after step s - 1
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        run.scheduler.step()
        step = s + 1
        progress.step(step, loss_total / world, lr_used, float(grad_norm))

        if tcfg.val_every and step % tcfg.val_every == 0 and step < total and run.val_windows is not None:
            run_validation(run, step)
        if stop_now > 0:
            path = run.checkpoint(step, progress.last_loss)
            if run.rank0:
                warn(f"{stop.signal or 'stop signal (received by another rank)'}: checkpoint {path} written at step {step}; "
                     f"exiting with status {REQUEUE_EXIT} (rerun the command to resume)")
            return TrainResult("interrupted", step, checkpoint=path, rank0=run.rank0)
        if tcfg.checkpoint_every and step % tcfg.checkpoint_every == 0 and step < total:
            run.checkpoint(step, progress.last_loss)
            run.saved_at = step
    return None


# ----------------------------------------------------------------------------------------------
# Finish: validate, the final checkpoint, model.safetensors and train.json


def finish(run: Run, progress: Progress) -> TrainResult:
    fabric, tcfg, total = run.fabric, run.tcfg, run.tcfg.total_steps
    steady_tok_s = progress.steady_tokens_per_s()
    if run.val_windows is not None:
        run_validation(run, total)
    if run.saved_at != total:
        run.checkpoint(total, progress.last_loss)
    weights = full_state_dict(fabric, run.raw_model)  # every rank: FSDP gathers
    tracker = run.tracker
    summary = {
        "run": run.rc.run.id, "steps": total, "tokens": total * tcfg.tokens_per_step,
        "final_train_loss": progress.last_loss, "final_val_loss": run.val_loss,
        "val_curve": run.state["val_curve"], "val_windows": run.val_windows_id,
        "wall_time_s": round(run.elapsed(), 3), "resumed_from_step": progress.start if run.resume else None,
        "inexact_resume": run.inexact or None,  # the changes a resume applied (the steps after it differ)
        "tokens_per_s": steady_tok_s,  # after the first log window, validation and checkpoints included
        "world_size": fabric.world_size, "num_nodes": tcfg.num_nodes, "accumulation": tcfg.accumulation,
        "precision": run.precision, "strategy": type(fabric.strategy).__name__,
        "cluster_environment": _cluster_environment(fabric),
        "params": sum(p.numel() for p in run.raw_model.parameters()),
        "mlflow_run_id": tracker.run_id if tracker is not None else None,
        "mlflow_tracking_uri": tracker.uri if tracker is not None else None,
        "code_version": code_version(),
    }
    # The last collective: the other ranks end here rather than wait at a barrier while rank 0
    # writes the weights and uploads the model to MLflow, which may take longer than the process
    # group's timeout (train.dist_timeout_s) allows a collective to wait.
    fabric.barrier()
    if run.rank0:
        save_final(run.run_dir, weights, run.config)
        if tracker is not None and tcfg.mlflow_log_model:
            summary["mlflow_model_id"] = _log_model(run, tracker, total)  # None: no tokenizer to export with
        atomic_write_json(run.run_dir / TRAIN_SUMMARY, summary)
    return TrainResult("finished", total, summary, run.store.path(total), rank0=run.rank0)


def _log_model(run: Run, tracker: Tracker, step: int) -> str | None:
    """The final weights as the run's MLflow model (tracking.registry.log_model), registered where
    train.mlflow_register_model names a model."""
    from stateloop.data.shards import read_meta
    from stateloop.data.tokenizer import TOKENIZER_FILE
    from stateloop.sections.train import registered_model_name
    from stateloop.tracking.registry import log_model

    r, tcfg = run.rc.run, run.tcfg
    data_dir = Path(run.rc.data.dir)
    tokenizer = read_meta(data_dir).get("tokenizer") if (data_dir / "meta.json").is_file() else None
    if not (isinstance(tokenizer, dict) and (data_dir / tokenizer.get("file", TOKENIZER_FILE)).is_file()):
        warn(f"{data_dir}: no tokenizer file beside the shards, so no MLflow model is logged "
             "(the export needs one; train.mlflow_log_model)")
        return None
    fields = {"scale": r.scale, "model": r.model, "K": r.K, "d_s": run.rc.d_s}
    register = registered_model_name(tcfg.mlflow_register_model, **fields) if tcfg.mlflow_register_model else ""
    params = {**{k: str(v) for k, v in fields.items()}, "params": str(sum(p.numel() for p in run.raw_model.parameters()))}
    return log_model(tracker.client, tracker.run_id, run.run_dir, r.id, params, {"code_version": code_version()},
                     step, register=register)


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _cluster_environment(fabric) -> str | None:
    """Which cluster environment started the processes (SLURMEnvironment under srun), if any."""
    env = getattr(fabric.strategy, "cluster_environment", None)
    return type(env).__name__ if env is not None else None


def run_validation(run: Run, step: int) -> None:
    """Validate after optimiser step ``step``: the run's last loss, a point of its curve, MLflow.
    A model of the StateLoop family also reports its state's diagnostics on the same windows (the
    point's ``state``; MLflow ``val/state/<quantity>_<i>``, evaluate/diagnostics.py)."""
    from stateloop.evaluate import diagnostics as diag

    run.val_loss, state = validate(run.fabric, run.model, run.val_windows, run.tcfg.micro_batch,
                                   diagnostics=diag.supports(run.raw_model))
    point = {"step": step, "tokens": step * run.tcfg.tokens_per_step, "loss": run.val_loss}
    if state is not None:
        point["state"] = state
    run.state["val_curve"].append(point)
    if run.tracker is not None:
        run.tracker.log_metrics(_val_metrics(run.val_loss) | (diag.step_metrics(state) if state else {}), step)


def _val_metrics(loss: float) -> dict:
    return {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}  # capped: a diverged run still logs


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


def _folder_conflict(run_dir: Path, config: dict) -> str | None:
    """Why the run folder's progress cannot continue under ``config`` (a changed model key, or an
    optimiser key where the run has progress), else None. Another run id is refused elsewhere."""
    path = run_dir / RUN_CONFIG
    old = upgrade_saved(load_yaml(path))
    if old.get("model") != config["model"]:
        key = next(k for k in sorted(set(old.get("model") or {}) | set(config["model"]))
                   if (old.get("model") or {}).get(k) != config["model"].get(k))
        return f"model.{key} = {config['model'].get(key)!r} differs from the run's {(old.get('model') or {}).get(key)!r} in {path}"
    progress = any((run_dir / "checkpoints").glob("*")) or has_final_weights(run_dir)
    for key in OPTIMIZER_KEYS if progress else ():
        before, now = (old.get("train") or {}).get(key), config["train"].get(key)
        if before != now:
            return (f"train.{key}: {now!r} differs from {before!r} in {path}, and a resumed optimizer and "
                    f"schedule would keep {before!r}")
    return None


def check_run_folder(run_dir: Path, config: dict, restart: bool = False) -> str | None:
    """One folder holds one run. Before anything is written: refuse to train another run (another
    id) into a folder that holds one, and refuse a changed model setting, or a changed optimiser
    setting where the run has progress to resume (its checkpoints or final weights would bring the
    old value back). ``restart`` (``--restart-on-change``, which the DAG's train rule passes: a
    changed setting is why Snakemake reruns the job): such a change is returned instead, and
    :func:`train` starts the run afresh, saying so: its checkpoints and final weights are removed."""

    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    old = upgrade_saved(load_yaml(path))
    old_id, new_id = (old.get("run") or {}).get("id"), config["run"]["id"]
    if old_id != new_id:
        raise ConfigError(f"{run_dir}: holds run {old_id}, not {new_id}; train into another --out folder")
    conflict = _folder_conflict(run_dir, config)
    if conflict is not None and not restart:
        raise ConfigError(f"{run_dir}: {conflict}; restore it, train into another --out folder, or pass "
                          f"--restart-on-change to start the run afresh")
    return conflict


def _total_steps(train: dict) -> int:
    """TrainConfig.total_steps of a saved ``train`` section."""
    if train.get("max_tokens"):
        return train["max_tokens"] // (train["global_batch"] * train["seq_len"])
    return int(train.get("max_steps") or 0)


def refuse_positional_optimizer_state(path) -> None:
    """FSDP resumes an optimizer state keyed by parameter name (what an FSDP run writes). One process
    and DDP write it keyed by position in the optimizer's groups, which Fabric re-keys in
    ``model.parameters()`` order, not the groups' (decayed matrices first): the moments would land on
    the wrong parameters. Refused in one line before anything is loaded. (The other way round, an
    FSDP checkpoint resumed by one process or DDP, the names are read in the groups' order: exact.)"""
    from stateloop.files import safe_torch_load

    state = (safe_torch_load(path, mmap=True, legacy_numpy=True).get("optimizer") or {}).get("state") or {}
    if any(isinstance(k, int) for k in state):
        raise ConfigError(f"{path}: written by one process or DDP, and train.strategy fsdp cannot resume its "
                          f"optimizer state (keyed by position); resume with train.strategy ddp, or train into "
                          f"another --out folder")


def _check_resume(path, saved: dict, current: dict, saved_data: dict | None, data: dict, step: int) -> list[str]:
    """A checkpoint resumes only the model and optimiser settings it holds (a folder copied without
    its config.yaml is checked here); every other change it applies is warned about and returned
    (the run records it: the steps after the resume differ from an uninterrupted run's)."""
    name = Path(path).name
    changes = []
    if saved.get("model") != current["model"]:
        keys = sorted(k for k in set(saved.get("model", {})) | set(current["model"])
                      if saved.get("model", {}).get(k) != current["model"].get(k))
        raise ConfigError(f"{path}: model.{keys[0] if keys else '?'} differs from the checkpoint's config; "
                          f"train into a new --out folder")
    for key in (k for k in OPTIMIZER_KEYS if k in saved["train"]):  # the keys the checkpoint records
        before, now = saved["train"][key], current["train"].get(key)
        if before != now:
            raise ConfigError(f"train.{key}: {now!r} differs from {before!r} in {path}, and a resumed optimizer and "
                              f"schedule would keep {before!r}; restore it, or train into another --out folder")
    old_print = (saved_data or {}).get("fingerprint")
    if old_print and old_print != data["fingerprint"]:
        changes.append(f"the {data['split']!r} tokens in {data['dir']} changed since {name} "
                       f"({saved_data.get('tokens')} -> {data['tokens']} tokens, shards {old_print} -> {data['fingerprint']}): "
                       f"the resumed batch stream differs from an uninterrupted run's")
    old_stream = (saved_data or {}).get("stream", "uniform-starts")
    if old_stream != data["stream"]:
        changes.append(f"{name} was trained on the {old_stream!r} batch stream, this code draws {data['stream']!r}: "
                       f"the resumed batch stream differs from an uninterrupted run's")
    for key in STREAM_KEYS:
        before, now = saved["train"].get(key), current["train"].get(key)
        if before != now:
            changes.append(f"train.{key} changed since {name} ({before} -> {now}): "
                           f"the resumed batch stream differs from an uninterrupted run's")
    for key in (k for k in COMPUTE_KEYS if k in saved["train"]):
        before, now = saved["train"][key], current["train"].get(key)
        if before != now:
            changes.append(f"train.{key} changed since {name} ({before} -> {now}): the steps from {step} on compute "
                           f"the same batches another way, not bitwise as an uninterrupted run would")
    if saved["train"].get("grad_clip") != current["train"].get("grad_clip"):
        changes.append(f"train.grad_clip changed since {name} ({saved['train'].get('grad_clip')} -> "
                       f"{current['train'].get('grad_clip')}): the steps from {step} on clip at the new value")
    old_total, new_total = _total_steps(saved["train"]), _total_steps(current["train"])
    t = current["train"]  # lr, min_lr, warmup_steps and schedule: the checkpoint's (checked above)
    if old_total != new_total and any(
            lr_at(s, t["lr"], t["min_lr"], t["warmup_steps"], old_total, t["schedule"])
            != lr_at(s, t["lr"], t["min_lr"], t["warmup_steps"], new_total, t["schedule"]) for s in range(step, min(old_total, new_total))):
        changes.append(f"the budget changed since {name} ({old_total} -> {new_total} steps; train.max_tokens, train.max_steps): "
                       f"the lr schedule is spliced at step {step} (it follows the new budget from there)")
    for line in changes:
        warn(line)
    return changes
