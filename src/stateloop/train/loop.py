"""The training loop: Lightning Fabric, AdamW, warmup + cosine, accumulation, exact resume.

``train(config, run_dir)`` trains one run from its resolved config (resolve.resolve_run) into
``run_dir`` (runs.py describes the folder; run_folder.py its lock and resume policy). In litgpt's
order, :func:`setup` -> :func:`fit` -> :func:`finish`:

- setup: Fabric from ``train.{accelerator, devices, num_nodes, strategy, precision}`` (under srun
  in a SLURM job, one task per device: workflow/rules/common.smk); the model, optimizer and
  schedule from the seed, overwritten by the newest complete checkpoint.
- fit: step s reads ``accumulation`` micro-batches per device (batch = f(seed, s, rank, micro)),
  each loss divided by their count, syncs gradients on the last, clips, checks loss and norm are
  finite on every rank (one all-reduce that carries a signal's stop request), steps.
- finish: validate, the final checkpoint, model.safetensors and train.json (``val_curve``, and
  ``val_windows`` with their sha256: the report checks that compared runs share them).

A signal (train/signals.py) stops at the next step boundary with a checkpoint and exit
:data:`REQUEUE_EXIT` = 75; a non-finite loss or norm raises :class:`NonFiniteLoss` before the
optimiser moves, the last good checkpoint kept.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stateloop.config import ConfigError
from stateloop.config.run import RunConfig
from stateloop.data.check import open_data
from stateloop.evaluate import diagnostics as diag
from stateloop.evaluate.perplexity import heldout_windows, token_nll
from stateloop.files import atomic_write_json, code_version
from stateloop.models.registry import build_model
from stateloop.runs import TRAIN_SUMMARY, resolve_device, save_final
from stateloop.tracking.tracker import Tracker, log_final_model, open_training_run
from stateloop.train.checkpoint import CheckpointStore, direct_checkpoint_io, warn
from stateloop.train.checkpointing import apply_checkpointing
from stateloop.train.compiling import compile_counts, compile_units
from stateloop.train.flops import flops_per_sequence, peak_flops
from stateloop.train.loss import lm_loss
from stateloop.train.parallel import fsdp_strategy, full_state_dict, local
from stateloop.train.run_folder import RunFolder, claim, latest, resume
from stateloop.train.sampler import STREAM, TokenSampler
from stateloop.train.schedule import lr_lambda
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
    rank0: bool = True  # False in the other processes of a multi-device run (they print nothing)


@dataclass
class Trainee:
    """The model on the Fabric, its optimizer and schedule."""

    fabric: object
    precision: str
    raw_model: torch.nn.Module  # as built: its parameters (under FSDP, their shards in place), flags, state dict
    model: torch.nn.Module  # as Fabric set it up (wrapped; with train.compile its units compiled): what trains
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR


@dataclass
class Validation:
    """The held-out windows every validation reads, which ones they are (train.json's val_windows;
    none without a validation split), and the run's validation curve."""

    windows: torch.Tensor | None
    identity: dict | None
    curve: list


def train(config: RunConfig | dict, run_dir: str | Path, progress: bool = True, restart: bool = False) -> TrainResult:
    """Train (or resume) the run of a resolved config (resolve.resolve_run's, or a saved one) in
    ``run_dir``. Call on every rank. Every check runs before anything is written; the launching
    process holds the folder (run_folder.claim; ``restart``: ``--restart-on-change``) throughout."""
    rc = config if isinstance(config, RunConfig) else RunConfig.read(config)
    require_accelerator(rc.train)  # first: every training (the command, the warm server, the tests) passes here
    shards = open_data(rc)  # (train, val): verified once, read by setup
    with claim(Path(run_dir), rc.as_dict(), restart):
        t, folder, sampler, val, tracker = setup(rc, Path(run_dir), shards)
        stop, meter = StopRequest(), Progress(rc, t, folder, tracker, progress)
        stop.install()
        status = "FAILED"
        try:
            result = fit(rc.train, t, folder, sampler, val, tracker, stop, meter) or finish(rc, t, folder, val, tracker, meter)
            status = "FINISHED" if result.status == "finished" else "KILLED"
            return result
        finally:
            stop.restore()
            meter.close()
            if tracker is not None:
                tracker.finish(status)


# ----------------------------------------------------------------------------------------------
# Setup: Fabric, model, optimizer and schedule, resume, data, tracking


def require_accelerator(tcfg) -> None:
    """``train.accelerator: cuda`` (or ``gpu``) where torch sees no GPU: one line naming the key and
    what to set for a CPU rehearsal, before anything is written or any process starts (Lightning
    would refuse it later, in a long traceback)."""
    if tcfg.accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ConfigError(f"train.accelerator: {tcfg.accelerator}, but torch sees no GPU here (torch.cuda.is_available() "
                          f"is False); for a CPU rehearsal --set train.accelerator=cpu train.precision=32-true "
                          f"(or train.accelerator=auto, which takes a GPU where there is one)")


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


def setup(rc: RunConfig, run_dir: Path, shards) -> tuple[Trainee, RunFolder, TokenSampler, Validation, Tracker | None]:
    tcfg = rc.train
    train_shards, val_shards = shards
    fabric, precision = build_fabric(tcfg)
    fabric.launch()
    if fabric.is_global_zero:
        run_dir.mkdir(parents=True, exist_ok=True)
    store = CheckpointStore(run_dir / "checkpoints", tcfg.keep_checkpoints)
    path = latest(fabric, store, run_dir)

    fabric.seed_everything(tcfg.seed, verbose=False)
    with fabric.init_module():  # in the precision's dtype; under FSDP on the CPU, sharded (and moved) by setup_module
        raw_model = build_model(rc.model)
    if tcfg.compile:
        compile_units(raw_model)  # per unit (train/compiling.py), wrapped by the checkpoint units
    apply_checkpointing(raw_model, tcfg.activation_checkpointing)  # its units: training forwards only; before FSDP
    decay = decaying(raw_model)
    model = fabric.setup_module(raw_model)  # under FSDP, raw_model's parameters are now its shards (in place)
    optimizer = configure_optimizer(raw_model, tcfg, fused=fabric.device.type == "cuda", decay=decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(tcfg, tcfg.total_steps))
    optimizer = fabric.setup_optimizers(optimizer)
    t = Trainee(fabric, precision, raw_model, model, optimizer, scheduler)

    # the batch stream is a function of (train tokens, seed, step); the checkpoint records which tokens
    data = {"dir": str(train_shards.dir), "split": train_shards.split, "tokens": len(train_shards),
            "fingerprint": train_shards.fingerprint(), "stream": STREAM}
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0, "tokens": 0, "elapsed": 0.0,
             "rng": None, "mlflow_run_id": None, "config": rc.as_dict(), "train_loss": None, "data": data}
    folder = resume(fabric, store, path, state, run_dir)

    world = fabric.world_size
    sampler = TokenSampler(train_shards, tcfg.seq_len, tcfg.global_batch, tcfg.micro_batch, world, tcfg.seed)
    val = Validation(None, None, state["val_curve"])
    if val_shards is not None:
        n = (tcfg.val_tokens // tcfg.seq_len) // world * world  # equal forwards on every rank
        windows = heldout_windows(val_shards, tcfg.seq_len, max_windows=max(n, world))
        val.windows = windows[: len(windows) // world * world]
        if len(val.windows) == 0:
            raise ConfigError(f"{val_shards.dir}/meta.json: split {tcfg.val_split!r} has fewer than one window of "
                              f"{tcfg.seq_len + 1} tokens per process ({world} processes)")
        # so that runs compared point by point can be checked to read the same windows
        digest = hashlib.sha256(val.windows.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()
        val.identity = {"split": tcfg.val_split, "windows": len(val.windows), "seq_len": val.windows.shape[1] - 1,
                        "sha256": digest}

    tracker = None
    if fabric.is_global_zero and tcfg.mlflow_tracking:
        datasets = {"training": train_shards, **({"validation": val_shards} if val_shards is not None else {})}
        tracker = open_training_run(rc, run_dir, state["mlflow_run_id"], folder.inexact, state["step"], datasets)
        state["mlflow_run_id"] = tracker.run_id
    folder.t0 = time.perf_counter() - state["elapsed"]  # this attempt's training starts now
    return t, folder, sampler, val, tracker


# ----------------------------------------------------------------------------------------------
# Progress: the bar or periodic lines, tokens/s and MFU, MLflow metrics of each log window


class Progress:
    """Rank 0 reports; every rank measures. Tokens/s and MFU of each log window come from
    Lightning's ``Throughput`` over the last two log steps (per device: ``seqs_dev`` sequences of
    ``seq_len`` tokens a step, ``flops_seq`` FLOPs each; the peak: train/flops.py)."""

    def __init__(self, rc: RunConfig, t: Trainee, folder: RunFolder, tracker: Tracker | None, bar: bool):
        from lightning_fabric.utilities.throughput import Throughput

        self.tcfg, self.tracker, self.world = rc.train, tracker, t.fabric.world_size
        self.rank0 = t.fabric.is_global_zero
        self.start = self.step_log = folder.state["step"]
        self.total = self.tcfg.total_steps
        self.seqs_dev = self.tcfg.global_batch // self.world
        peak = peak_flops(t.fabric.device, t.precision, self.tcfg.peak_tflops)
        self.flops_seq = None  # FLOPs of one sequence's forward + backward (MFU), where a peak is known
        if peak:
            try:
                self.flops_seq = flops_per_sequence(rc.model, self.tcfg.seq_len)
            except Exception as err:  # noqa: BLE001 - a model the meta-device FLOP counter cannot trace: no MFU
                if self.rank0:
                    warn(f"no MFU: FLOPs of {rc.model.name} could not be counted on the meta device ({type(err).__name__}: {err})")
        self.meter = Throughput(available_flops=peak if self.flops_seq else None, world_size=self.world, window_size=2)
        self.meter.update(time=0.0, batches=0, samples=0, lengths=0, flops=0 if self.flops_seq else None)
        self.losses: list[float] = []  # of the steps since the last log
        self.last_loss = folder.state["train_loss"]  # mean over the last log window
        self.t_line = -math.inf  # the last progress line (no bar): the first log step prints one
        self.steady = None  # (time, step) at the first log: throughput after warm-up is measured from here
        self.bar = None
        if self.rank0 and bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.start, unit="step", desc=rc.run.id,
                            dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
        self.t_start = time.perf_counter()

    def step(self, step: int, loss: float, lr: float, grad_norm: float) -> None:
        self.losses.append(loss)
        if self.bar is not None:
            self.bar.update(1)
        if step % self.tcfg.log_every == 0 or step == self.total:
            self.log(step, lr, grad_norm)

    def log(self, step: int, lr: float, grad_norm: float) -> None:
        tcfg, now = self.tcfg, time.perf_counter()
        done = step - self.start  # steps of this process
        self.meter.update(time=max(now - self.t_start, 1e-9 * done), batches=done, samples=done * self.seqs_dev,
                          lengths=done * self.seqs_dev * tcfg.seq_len,
                          flops=self.flops_seq * (step - self.step_log) * self.seqs_dev if self.flops_seq else None)
        rates = self.meter.compute()  # over this log window (window_size 2)
        tok_s = rates["device/items_per_sec"] * self.world
        metrics = {"train/loss": sum(self.losses) / len(self.losses), "train/lr": lr, "train/grad_norm": grad_norm,
                   "train/tokens_per_s": tok_s, "train/tokens": step * tcfg.tokens_per_step}
        if "device/mfu" in rates:
            metrics["train/mfu"] = rates["device/mfu"]
        self.last_loss = metrics["train/loss"]
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{self.last_loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        elif self.rank0 and (now - self.t_line >= PROGRESS_EVERY_S or step == self.total):
            self.t_line = now
            eta = int((self.total - step) * (now - self.t_start) / max(done, 1))
            warn(f"step {step}/{self.total} ({step / self.total:.0%}), {step * tcfg.tokens_per_step:,} tokens, "
                 f"loss {self.last_loss:.4f}, {tok_s:,.0f} tok/s, ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")
        self.losses.clear()
        self.step_log = step
        self.steady = self.steady or (now, step)

    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s after the first log window, validation and checkpoints included."""
        if self.steady is None or self.total <= self.steady[1]:
            return None
        return (self.total - self.steady[1]) * self.tcfg.tokens_per_step / (time.perf_counter() - self.steady[0])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------------
# Fit: the step loop (nanoGPT's order: batch, forward + backward, clip, step, log, evaluate, save)


def fit(tcfg, t: Trainee, folder: RunFolder, sampler: TokenSampler, val: Validation, tracker: Tracker | None,
        stop: StopRequest, progress: Progress) -> TrainResult | None:
    """Optimiser steps from the resumed one to the last; a TrainResult only when a signal stopped it."""
    fabric, model, optimizer = t.fabric, t.model, t.optimizer
    world, accum, total = fabric.world_size, tcfg.accumulation, tcfg.total_steps
    model.train()
    for s in range(folder.state["step"], total):
        loss_sum = torch.zeros((), device=fabric.device)
        for micro in range(accum):
            x, y = sampler.micro_batch_at(s, micro, fabric.global_rank)
            x, y = x.to(fabric.device, non_blocking=True), y.to(fabric.device, non_blocking=True)
            with fabric.no_backward_sync(model, enabled=world > 1 and micro < accum - 1):
                loss = lm_loss(model, x, y, tcfg.loss_chunk_tokens) / accum  # (12), over the global batch
                fabric.backward(loss)
            loss_sum += loss.detach()
        grad_norm = local(fabric.clip_gradients(model, optimizer, max_norm=tcfg.grad_clip or float("inf"),
                                                error_if_nonfinite=False))  # FSDP: a replicated DTensor
        # One all-reduce carries the loss, a non-finite flag and a stop request to every rank.
        local_bad = ~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm.to(loss_sum)))
        flags = torch.stack([loss_sum, local_bad.float(), torch.tensor(float(stop.signal is not None), device=loss_sum.device)])
        if world > 1:
            flags = fabric.all_reduce(flags, reduce_op="sum")
        loss_total, bad, stop_now = flags.tolist()
        if bad > 0:
            last_good = folder.store.path(folder.saved_at) if folder.saved_at is not None else None
            raise NonFiniteLoss(
                f"step {s + 1}: non-finite loss or gradient norm (loss {loss_total / world:.4g}, grad norm "
                f"{float(grad_norm):.4g}); training stopped before the optimizer step; the last good checkpoint "
                f"is {last_good or 'none (no checkpoint was written yet)'}")
        lr_used = optimizer.param_groups[0]["lr"]  # eta(s), set by the schedule after step s - 1
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t.scheduler.step()
        step = s + 1
        progress.step(step, loss_total / world, lr_used, float(grad_norm))

        if tcfg.val_every and step % tcfg.val_every == 0 and step < total and val.windows is not None:
            run_validation(t, val, tcfg, tracker, step)
        if stop_now > 0:
            path = folder.save(fabric, step, progress.last_loss, tcfg.tokens_per_step)
            if fabric.is_global_zero:
                warn(f"{stop.signal or 'stop signal (received by another rank)'}: checkpoint {path} written at step {step}; "
                     f"exiting with status {REQUEUE_EXIT} (rerun the command to resume)")
            return TrainResult("interrupted", step, rank0=fabric.is_global_zero)
        if tcfg.checkpoint_every and step % tcfg.checkpoint_every == 0 and step < total:
            folder.save(fabric, step, progress.last_loss, tcfg.tokens_per_step)
            folder.saved_at = step
    return None


# ----------------------------------------------------------------------------------------------
# Validate and finish: the final checkpoint, model.safetensors and train.json


@torch.no_grad()
def validate(fabric, model, windows: torch.Tensor, batch_size: int, diagnostics: bool = False) -> tuple[float, dict | None]:
    """Mean next-token NLL over the validation windows of every rank, and with ``diagnostics`` the
    state's per-iteration diagnostics over the same windows (evaluate/diagnostics.py), else None."""
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


def run_validation(t: Trainee, val: Validation, tcfg, tracker: Tracker | None, step: int) -> float:
    """Validate after optimiser step ``step``: a point of the curve, MLflow; the loss. A model of the
    StateLoop family also reports its state's diagnostics on the same windows (the point's ``state``;
    MLflow ``val/state/<quantity>_<i>``, evaluate/diagnostics.py)."""
    loss, state = validate(t.fabric, t.model, val.windows, tcfg.micro_batch, diagnostics=diag.supports(t.raw_model))
    val.curve.append({"step": step, "tokens": step * tcfg.tokens_per_step, "loss": loss} | ({"state": state} if state is not None else {}))
    if tracker is not None:
        metrics = {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}  # capped: a diverged run still logs
        tracker.log_metrics(metrics | (diag.step_metrics(state) if state else {}), step)
    return loss


def finish(rc: RunConfig, t: Trainee, folder: RunFolder, val: Validation, tracker: Tracker | None,
           progress: Progress) -> TrainResult:
    fabric, tcfg, total = t.fabric, rc.train, rc.train.total_steps
    steady_tok_s = progress.steady_tokens_per_s()
    val_loss = run_validation(t, val, tcfg, tracker, total) if val.windows is not None else None
    if folder.saved_at != total:
        folder.save(fabric, total, progress.last_loss, tcfg.tokens_per_step)
    weights = full_state_dict(fabric, t.raw_model)  # every rank: FSDP gathers
    params = sum(p.numel() for p in t.raw_model.parameters())
    env = getattr(fabric.strategy, "cluster_environment", None)  # SLURMEnvironment under srun
    summary = {
        "run": rc.run.id, "steps": total, "tokens": total * tcfg.tokens_per_step,
        "final_train_loss": progress.last_loss, "final_val_loss": val_loss,
        "val_curve": val.curve, "val_windows": val.identity,
        "wall_time_s": round(folder.elapsed(), 3), "resumed_from_step": progress.start if folder.resumed else None,
        "inexact_resume": folder.inexact or None,  # the changes a resume applied (the steps after it differ)
        "tokens_per_s": steady_tok_s,  # after the first log window, validation and checkpoints included
        "world_size": fabric.world_size, "num_nodes": tcfg.num_nodes, "accumulation": tcfg.accumulation,
        "precision": t.precision, "strategy": type(fabric.strategy).__name__,
        "cluster_environment": type(env).__name__ if env is not None else None, "params": params,
        "mlflow_run_id": tracker.run_id if tracker is not None else None,
        "mlflow_tracking_uri": tracker.uri if tracker is not None else None,
        "code_version": code_version(),
        "compile": compile_counts() if tcfg.compile else None,  # this process's graphs (train/compiling.py)
    }
    # The last collective: the other ranks end here rather than wait at a barrier while rank 0
    # writes the weights and uploads the model to MLflow, which may take longer than the process
    # group's timeout (train.dist_timeout_s) allows a collective to wait.
    fabric.barrier()
    if fabric.is_global_zero:
        save_final(folder.dir, weights, rc.as_dict())
        if tracker is not None and tcfg.mlflow_log_model:
            summary["mlflow_model_id"] = log_final_model(tracker, rc, folder.dir, params, total)  # None: no tokenizer
        atomic_write_json(folder.dir / TRAIN_SUMMARY, summary)
    return TrainResult("finished", total, summary, rank0=fabric.is_global_zero)
