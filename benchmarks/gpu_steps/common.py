"""What every step of the GPU check shares: the step's declaration (its cap and the arithmetic of
its estimate), its context (the device, the paper config, the clock it must stop by), and the
training and memory helpers the training steps use.

Rates the estimates use, from the 2026-12-04 H200 record
(benchmarks/records/gpu_check_h200_2026-12-04.json, 2026-12-04-gpu-check-h200.md), taken to hold on
an H100 SXM (the same 989 TFLOP/s dense bf16 datasheet peak; training there is compute-bound):

- TRAIN_RATE: eager bf16 training ran at 2.95e14 model FLOP/s (410M StateLoop, 17.42 GFLOP a token,
  4 x 2048 tokens a step in 0.484 s: 17.42e9 x 8192 / 0.484 = 2.95e14; 30% MFU);
- BLOCK_S: 6 s for one model's build and first steps beyond its timed steps: the 410M step's 161 s
  of wall, less its 64 timed and warm-up steps of about 0.5 s (32 s), less [assume] 80 s of mamba_ssm's
  first Triton compile and autotune in the Mamba-2 model's first block (the ssd_1.4b step's 84 s for
  twelve 5 ms kernel calls was nearly all of that), over its 8 blocks: (161 - 32 - 80) / 8 = 6 s;
- DECODE_S: 0.045 s a decoded token of a 1.4B model, eager, batch 1 (the record's 37-45 ms, host-bound);
- COMPILE_S: the first compiled step, never measured on a GPU: [assume] 30 s at either scale for
  ``train.compile: true``'s units (train/compiling.py: every decoder layer and the state branch
  compiled in place; one layer graph serves every layer and iteration): on this project's 2-core
  CPU the first compiled steps of a tiny StateLoop take 40 s (9 graphs, fresh inductor cache).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

TRAIN_RATE = 2.95e14  # model FLOP/s of eager bf16 training (module docstring)
BLOCK_S = 6.0  # one model's build and first steps, beyond its timed steps (module docstring)
DECODE_S = 0.045  # one eager decoded token at 1.4B, batch 1
COMPILE_S = {"410m": 30.0, "1.4b": 30.0}  # [assume] the first compiled step (module docstring)
GIB = 2**30


class StepTimeout(BaseException):
    """A step ran past its cap. A BaseException, so that no ``except Exception`` on the way swallows it."""


class Skip(Exception):
    """The step cannot run here (its reason is recorded)."""


@dataclass(frozen=True)
class Step:
    """One measurement: ``run(ctx, out)`` fills ``out`` (the step's entry in the JSON) as it goes, so
    a step stopped at its cap keeps what it measured. ``estimate_s`` and ``arithmetic`` are the
    estimate on an H100 at the record's rates; ``cap_s`` the time it may take before it is stopped."""

    name: str
    run: Callable
    estimate_s: float
    arithmetic: str
    cap_s: float
    headline: Callable[[dict], str] = lambda out: ""


@dataclass
class Context:
    """What a step runs with. ``check()`` between inner iterations raises :class:`StepTimeout` past
    the step's deadline (the runner's alarm is the backstop for a step stuck in one long call)."""

    device: torch.device
    cfg: object  # the paper's PipelineConfig (rehearsal sizes under --smoke)
    args: object  # the parsed command line
    report: dict  # the whole record (steps read earlier steps' figures; MFU entries go to report["mfu"])
    step: str = ""  # the running step's name
    deadline: float = math.inf

    @property
    def smoke(self) -> bool:
        return bool(self.args.smoke)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def check(self) -> None:
        if time.perf_counter() > self.deadline:
            raise StepTimeout()

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    @contextlib.contextmanager
    def no_alarm(self):
        """The alarm held back (a CUDA graph capture must not be left half done); it fires after."""
        if not hasattr(signal, "pthread_sigmask"):
            yield
            return
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})

    def add_mfu(self, entry: dict) -> None:
        self.report.setdefault("mfu", []).append(entry)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    """Give back what the last model held (its tensors must be unreferenced)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def kernels_found() -> dict:
    from stateloop.models import kernels

    return {"flash_attn": kernels.HAS_FLASH_ATTN, "mamba_ssm": kernels.HAS_MAMBA_SSM,
            "mamba_decode": kernels.HAS_MAMBA_DECODE, "causal_conv1d": kernels.HAS_CAUSAL_CONV1D}


def last_lines(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# ----------------------------------------------------------------------------------------------
# Models of the paper config


def run_config(ctx: Context, scale: str, name: str, K: int, d_s: int, **model_changes):
    """The run's ModelConfig at ``scale`` (paper.yaml, or its rehearsal sizes) with ``name``, K, d_s."""
    from stateloop.experiments import run_model_config
    from stateloop.models.registry import get_spec

    sc = ctx.cfg.scales[scale]
    if model_changes:
        sc = dataclasses.replace(sc, model=dataclasses.replace(sc.model, **model_changes))
    return run_model_config(sc, name, K, get_spec(name).width(d_s))


def experiment(ctx: Context, name: str) -> tuple[str, int, int]:
    """(scale, K, d_s) of one of paper.yaml's experiments (table1: 1.4B K = 4; table4: 410M K = 7)."""
    exp = ctx.cfg.experiments[name]
    return exp.scale, exp.K[0], exp.d_s[0]


def seq_len(ctx: Context, scale: str) -> int:
    return min(ctx.args.seq, ctx.cfg.scales[scale].model.max_seq_len)


def train_flops_per_token(model_cfg, seq: int) -> float:
    """The project's count (models/flops.py, which train/flops.py's MFU and ``stateloop plan`` use)."""
    from stateloop.models.flops import compute_profile

    return compute_profile(model_cfg, seq).flops_per_token


def peak(ctx: Context) -> tuple[float | None, str]:
    """The datasheet bf16 peak (train/flops.py), or on a CPU the measured matmul rate (smoke only)."""
    from stateloop.train.flops import peak_flops

    found = peak_flops(ctx.device, "bf16-mixed")
    if found:
        return found, "datasheet (train/flops.py)"
    measured = ctx.report["steps"].get("matmul_peak", {}).get("flops_per_s")
    return measured, "measured matmul_peak (no datasheet peak for this device)"


# ----------------------------------------------------------------------------------------------
# Memory: the measured peak beside the plan's figure


def plan_figure(model_cfg, seq: int, micro: int, checkpointing: str = "none") -> dict:
    """ops/memory.py's plan for one training process on one device (no DDP buckets, no shards) at
    this setting, as ``stateloop plan`` computes it: ``allocated`` is what max_memory_allocated
    should show, ``total`` adds the allowance the plan keeps for the rest."""
    from stateloop.models import kernels
    from stateloop.ops.memory import Setting, plan_memory

    setting = Setting(micro_batch=micro, activation_checkpointing=checkpointing, devices=1, num_nodes=1,
                      precision="bf16-mixed", accumulation=1)
    plan = plan_memory(model_cfg, seq, setting, mamba_kernels=kernels.HAS_MAMBA_SSM)
    return {"allocated_gib": plan.allocated / GIB, "total_gib": plan.total / GIB, "static_gib": plan.static / GIB,
            "activations_gib": plan.activations / GIB, "loss_gib": plan.loss / GIB, "instant": plan.instant,
            "setting": setting.label}


def device_memory_gib(ctx: Context) -> float | None:
    if not ctx.cuda:
        return None
    return torch.cuda.get_device_properties(ctx.device).total_memory / GIB


def fitting_micro(ctx: Context, model_cfgs: list, seq: int, choices=(4, 2, 1)) -> tuple[int, str]:
    """The largest micro-batch of ``choices`` whose plan (total) fits this device for every model."""
    gib = device_memory_gib(ctx)
    if gib is None:
        return choices[-1], "CPU: the smallest"
    for mb in choices:
        worst = max(plan_figure(c, seq, mb)["total_gib"] for c in model_cfgs)
        if worst <= gib:
            return mb, f"the plan's {worst:.1f} GiB fits {gib:.1f} GiB"
    return choices[-1], f"none fits {gib:.1f} GiB by the plan; the smallest"


def reset_peak(ctx: Context) -> None:
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)


def measured_peak(ctx: Context, plan: dict | None = None) -> dict:
    """max_memory_allocated since the last reset, beside the plan's figure; on a CPU, skipped."""
    if not ctx.cuda:
        return {"peak_gib": None, "peak_skipped": "torch.cuda.max_memory_allocated has no CPU counterpart",
                **({"plan": plan} if plan else {})}
    gib = torch.cuda.max_memory_allocated(ctx.device) / GIB
    out = {"peak_gib": gib}
    if plan:
        out.update(plan=plan, peak_over_plan_allocated=gib / plan["allocated_gib"])
    return out


# ----------------------------------------------------------------------------------------------
# Training steps as train/loop.py takes them


def build(ctx: Context, model_cfg, seed: int = 0):
    from stateloop.models.registry import build_model

    torch.manual_seed(seed)
    return build_model(model_cfg, device=ctx.device).train()


def optimizer(ctx: Context, model, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW as the training loop makes it (fused on CUDA)."""
    fused = ctx.cuda if fused is None else fused
    return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused or None)


def batch(ctx: Context, vocab: int, micro: int, seq: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (micro, seq + 1), generator=g).to(ctx.device)
    return x[:, :-1], x[:, 1:]


def autocast(ctx: Context):
    """bf16-mixed: torch's autocast in bf16 (on the CPU too: the policy's dtypes are the same there)."""
    return torch.autocast(ctx.device.type, dtype=torch.bfloat16)


def train_step(ctx: Context, model, opt, x, y) -> float:
    """One optimiser step as train/loop.py takes it: eq. (12)'s loss under bf16 autocast, backward,
    clip at 1.0, AdamW, gradients set to None."""
    from stateloop.train.loss import lm_loss

    with autocast(ctx):
        loss = lm_loss(model, x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def timed_steps(ctx: Context, model, opt, x, y, warmup: int, steps: int, out: dict, key: str = "step_s") -> dict:
    """``warmup`` steps, then ``steps`` each timed (synchronised); ``out[key]`` grows step by step,
    so a timeout keeps the steps done. The first warm-up step's own time is ``out['first_step_s']``.
    Under --smoke one of each."""
    if ctx.smoke:
        warmup, steps = min(warmup, 1), min(steps, 1)
    times = out.setdefault(key, [])
    for i in range(warmup + steps):
        ctx.check()
        sync(ctx.device)
        t0 = time.perf_counter()
        loss = train_step(ctx, model, opt, x, y)
        sync(ctx.device)
        if i == 0:
            out["first_step_s"] = time.perf_counter() - t0
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    out["last_loss"] = float(loss.detach())
    return out


def throughput(ctx: Context, out: dict, flops_per_token: float, tokens_per_step: int, key: str = "step_s") -> dict:
    """tokens/s from the median timed step, and MFU against the peak of :func:`peak`."""
    import statistics

    if not out.get(key):
        return out
    step = statistics.median(out[key])
    top, source = peak(ctx)
    out.update(tokens_per_s=tokens_per_step / step, train_flops_per_token=flops_per_token,
               mfu=flops_per_token * tokens_per_step / step / top if top else None, peak_flops=top, peak_source=source)
    return out


def mfu_entry(ctx: Context, step: str, scale: str, model: str, compiled: bool, row: dict, **setting) -> None:
    """One flat entry of the record's ``mfu`` list (what ``stateloop plan`` reads)."""
    if row.get("tokens_per_s") is None:
        return
    ctx.add_mfu({"step": step, "scale": scale, "model": model, "compile": compiled, "precision": "bf16-mixed",
                 "mfu": row["mfu"], "tokens_per_s": row["tokens_per_s"], "peak_flops": row["peak_flops"],
                 "train_flops_per_token": row["train_flops_per_token"], **setting})


def dynamo_reset() -> None:
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
