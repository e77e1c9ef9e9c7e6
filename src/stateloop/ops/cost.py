"""What training every run of a pipeline config costs (``stateloop plan``): per run, parameters,
FLOPs (models/flops.py), the planned peak memory per device (ops/memory.py) against
``train.gpu_memory_gib``, and the wall time at an MFU against its SLURM job's runtime; totals per
experiment and overall. ``--compare-strategies`` sets each run's alternatives side by side; where
the memory is known the plan chooses (:func:`choose`): DDP where it fits within the limit less a
margin (:data:`DEFAULT_MARGIN`), sharding only where it must.

**Time of one optimiser step** (per device):

- Compute: the training FLOPs at ``mfu`` of ``peak_tflops``. The MFU is the newest GPU record's for
  the scale's setting, eager or compiled (ops/mfu.py; ``stateloop plan`` names the record on its first
  line), a figure or a function of the scale here; [assume] the same at every micro-batch. Checkpointing adds
  the recomputed forward, a chunked loss the head's forward again.
- Exposed communication: a parameter's gradient can be reduced once backward reaches its first
  use in the forward (the measured order, ops/memory.py); in a looped model that is the last 1/K
  of backward for the shared stack. One queue: bytes join when final, the link reduces them in
  turn, what is left at backward's end is exposed. DDP: one ring all-reduce per step. FSDP2: the
  reduce-scatters and all-gathers that tests/support/fsdp_probe.py counts (tests/train/test_memory_plan.py).
  [assume] Links: ``inter_node_gbps`` per node (400 Gb/s, one NDR InfiniBand port) and
  ``intra_node_gbs`` per GPU (360 GB/s, NCCL's all-reduce bus bandwidth over NVLink on 8 x H100).
- Validation, checkpoints (at ops/cluster.py's rates: :func:`checkpoint_seconds`) and each job's start
  (:data:`STARTUP_S`, plus reading the checkpoint back, [assume] as long as writing it).

**Per job, not per total.** A training job checkpoints and requeues itself before its limit
(train/slurm.py), so a run may span several jobs: the check is that a job can start, resume, make a step
and save it within its limit (``no progress`` otherwise); ``requeue xN`` flags runs of several jobs.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stateloop.config.pipeline import PipelineConfig
from stateloop.experiments import expand_runs, run_model_config
from stateloop.files import atomic_write_bytes
from stateloop.models.registry import count_params, get_spec
from stateloop.ops import measured, memory
from stateloop.ops.cluster import (
    CHECKPOINT_BYTES_PER_PARAM,
    CHECKPOINT_HASH_BYTES_PER_S,
    CHECKPOINT_WRITE_BYTES_PER_S,
    estimated_params,
    warning_seconds,
)
from stateloop.ops.memory import ALLOWANCE_FRACTION, ALLOWANCE_GIB, Setting, parameter_bytes, plan_memory
from stateloop.ops.mfu import FALLBACK_MFU

if TYPE_CHECKING:
    from stateloop.ops.memory import MemoryPlan

DEFAULT_MFU = FALLBACK_MFU  # a library call's default; `stateloop plan` reads the records (ops/mfu.py)
DEFAULT_PEAK_TFLOPS = 989.0  # H100 / H200 SXM dense bf16
# [choice] The share of train.gpu_memory_gib a chosen setting leaves free: the plan's estimate is
# checked to within a few percent (ops/memory.py) on the parts it has measured, and what the GPU
# adds beyond them (allocator fragmentation at a new shape, NCCL's buffers) is an allowance, not a
# measurement.
DEFAULT_MARGIN = 0.10
STARTUP_S = 120.0  # [assume] a job's start: imports, process group, model, data, before the first step


@dataclass(frozen=True)
class Network:
    """The links gradients and parameters travel over ([assume]: module docstring)."""

    inter_node_gbps: float = 400.0  # per node, Gb/s
    intra_node_gbs: float = 360.0  # per GPU within a node, GB/s (NCCL bus bandwidth over NVLink)

    def bandwidth(self, spans_nodes: bool) -> float:
        """Bytes/s of a collective's bottleneck link."""
        return self.inter_node_gbps * 1e9 / 8 if spans_nodes else self.intra_node_gbs * 1e9


@dataclass(frozen=True)
class TimePlan:
    compute_s: float  # per optimiser step
    comm_s: float  # exposed communication per optimiser step
    step_s: float
    train_s: float  # steps, validation, checkpoints
    jobs: int  # SLURM jobs (time limits) the run spans
    wall_s: float  # train_s + every job's start (and resume)
    gpu_hours: float
    flag: str  # "", "requeue xN", "no progress"


def checkpoint_seconds(params: int) -> float:
    """Seconds to write and hash (or read and hash) a checkpoint of ``params`` parameters."""
    size = CHECKPOINT_BYTES_PER_PARAM * params
    return size / CHECKPOINT_WRITE_BYTES_PER_S + size / CHECKPOINT_HASH_BYTES_PER_S


def _reduce_queue(ready: list[tuple[float, float]], backward_s: float) -> float:
    """Exposed seconds of reductions (when final in backward, seconds) reduced in turn by one link."""
    done = 0.0
    for at, seconds in sorted(ready):
        done = max(done, at) + seconds
    return max(0.0, done - backward_s)


def plan_time(model_cfg, tcfg, setting, flops_per_token: float, profile, params, runtime_min: int,
              mfu: float = DEFAULT_MFU, peak_tflops: float = DEFAULT_PEAK_TFLOPS, network: Network = Network()) -> TimePlan:
    """The time plan of one run trained as ``setting`` with ``tcfg``'s budget (module docstring);
    ``profile``, ``params``: the run's memory.SavedProfile and memory.ParamCounts."""
    rate = mfu * peak_tflops * 1e12
    d, V = model_cfg.d_model, model_cfg.vocab_size
    head_share = min(1.0, 6 * d * V / flops_per_token)
    recompute = 0.0
    if setting.activation_checkpointing != "none":
        recompute += (1 - head_share) / 3
    if setting.loss_chunk_tokens:
        recompute += 2 * d * V / flops_per_token
    tokens = setting.micro_batch * tcfg.seq_len
    micro_s = tokens * flops_per_token * (1 + recompute) / rate
    forward_s = tokens * flops_per_token / 3 / rate
    backward_s = micro_s - forward_s
    apps = max(profile.layer_apps, 1)
    app_forward_s = forward_s * (1 - head_share) / apps
    app_backward_s = backward_s * (1 - head_share) / apps
    comm = 0.0
    nodes, world = setting.num_nodes, setting.world
    pb = parameter_bytes(setting.precision)
    if world > 1 and not setting.sharded:  # DDP: one all-reduce of the float32 gradients per step
        bw = network.bandwidth(nodes > 1)
        ready = [(backward_s * (1 - f), 2 * (world - 1) / world * pb * n / bw) for f, n in profile.first_use]
        comm = _reduce_queue(ready, backward_s)
    elif setting.sharded:  # FSDP2 (train/parallel.py): float32 gathered and reduced, as DDP reduces
        group = setting.shard_group
        hybrid = setting.fsdp_sharding.startswith("hybrid")
        bw_group = network.bandwidth(group > setting.devices)
        bw_nodes = network.bandwidth(True)

        def gather_s(n):
            return (group - 1) / group * pb * n / bw_group

        def reduce_s(n):
            s = gather_s(n)
            if hybrid and nodes > 1:  # the shards all-reduced across nodes
                s += 2 * (nodes - 1) / nodes * pb * n / bw_nodes
            return s

        unit = params.unit_max
        per_app_fwd = max(0.0, gather_s(unit) - app_forward_s)
        per_app_bwd = max(0.0, gather_s(unit) - app_backward_s)
        layer_units = round((params.loop + params.unique_layers) / unit) if unit else 0
        if setting.fsdp_sharding in ("grad_op", "hybrid_grad_op"):
            # once per unit in the forward; in backward a looped unit is resharded after each
            # application and gathered again for the next (K - 1 per looped unit)
            gathers = layer_units * per_app_fwd + (apps - layer_units) * per_app_bwd + gather_s(params.root)
        else:  # every application, in the forward and again in backward; the root in each
            gathers = apps * (per_app_fwd + per_app_bwd) + 2 * gather_s(params.root)
        ready = [(backward_s * (1 - f), reduce_s(n)) for f, n in profile.first_use]
        if setting.accumulation > 1:  # the looped units' earlier gradients, reduced at their first post-backward
            ready.append((backward_s / max(profile.loop_apps, 1), reduce_s(params.loop)))
        comm = setting.accumulation * gathers + _reduce_queue(ready, backward_s)
    compute = setting.accumulation * micro_s
    step = compute + comm
    steps = tcfg.total_steps
    val_passes = (steps // tcfg.val_every if tcfg.val_every else 0) + 1 if tcfg.val_tokens else 0
    val_s = val_passes * tcfg.val_tokens * flops_per_token / 3 / world / rate
    ckpt_s = checkpoint_seconds(params.total)
    saves = (steps // tcfg.checkpoint_every if tcfg.checkpoint_every else 0) + 1
    train_s = steps * step + val_s + saves * ckpt_s + 4 * params.total / CHECKPOINT_WRITE_BYTES_PER_S
    warning = warning_seconds(estimated_params(model_cfg), runtime_min)
    usable = runtime_min * 60 - warning - STARTUP_S - ckpt_s
    if usable < step + ckpt_s:
        jobs, flag = math.inf, "no progress"
        wall = math.inf
    else:
        jobs = max(1, math.ceil(train_s / usable))
        flag = f"requeue x{jobs}" if jobs > 1 else ""
        wall = train_s + jobs * STARTUP_S + (jobs - 1) * ckpt_s
    return TimePlan(compute, comm, step, train_s, jobs, wall, wall * world / 3600, flag)


# ----------------------------------------------------------------------------------------------
# Rows


def run_mfu(mfu: float | Callable[[str], float], scale: str) -> float:
    """The MFU of a run of ``scale``: ``mfu`` itself, or its figure for the scale (ops/mfu.py's PlanMfu)."""
    return mfu(scale) if callable(mfu) else mfu


def _run_plan(cfg: PipelineConfig, run, setting, mfu, peak_tflops, network, memo: dict | None = None) -> dict:
    """Memory and time of one run trained as ``setting`` (a row's columns); ``memo``: shared lookups."""
    from stateloop.models.flops import compute_profile  # torch: the plan command builds its parser without it

    measured.keep_flop_counts()  # each shape counted once, across processes too

    memo = {} if memo is None else memo
    scale = cfg.scales[run.scale]
    tcfg = scale.train
    if "flops" not in memo:
        memo["flops"] = compute_profile(run.model_config, tcfg.seq_len)
        memo["params"] = memory.param_counts(run.model_config, tcfg.seq_len, setting.precision)
    mb = (setting.micro_batch, setting.precision)
    if mb not in memo:
        memo[mb] = memory.saved_profile(run.model_config, setting.micro_batch, tcfg.seq_len, setting.precision)
    prof, params, saved = memo["flops"], memo["params"], memo[mb]
    mem = memory.plan_memory(run.model_config, tcfg.seq_len, setting, profile=saved, params=params)
    t = plan_time(run.model_config, tcfg, setting, prof.flops_per_token, saved, params, scale.resources.train.runtime,
                  run_mfu(mfu, run.scale), peak_tflops, network)
    return {"setting": setting.label, "strategy": setting.kind, "micro_batch": setting.micro_batch,
            "mem_gib": mem.total / memory.GIB, "mem_allocated_gib": mem.allocated / memory.GIB,
            "mem_static_gib": mem.static / memory.GIB, "mem_activations_gib": mem.activations / memory.GIB,
            "mem_loss_gib": mem.loss / memory.GIB, "mem_instant": mem.instant,
            "step_s": t.step_s, "comm_s": t.comm_s, "wall_h": t.wall_s / 3600, "jobs": t.jobs,
            "job_limit_h": scale.resources.train.runtime / 60, "gpu_hours": t.gpu_hours, "flag": t.flag,
            "fsdp_sharding": setting.fsdp_sharding, "activation_checkpointing": setting.activation_checkpointing,
            "loss_chunk_tokens": setting.loss_chunk_tokens}


def plan_rows(cfg: PipelineConfig, experiments=None, mfu: float | Callable[[str], float] = DEFAULT_MFU,
              peak_tflops: float = DEFAULT_PEAK_TFLOPS, network: Network = Network(), margin: float = DEFAULT_MARGIN,
              limit_gib: float | None = None) -> list[dict]:
    """One row per run of the experiments (default: every trained one); where its memory limit is
    known, also :func:`choose`'s setting and whether the config ``agrees``."""
    rows = []
    for run in expand_runs(cfg, experiments):  # each run once (expand_runs merges experiments)
        train = cfg.scales[run.scale].train
        memo: dict = {}
        current = _run_plan(cfg, run, Setting.of(train), mfu, peak_tflops, network, memo)
        prof, params = memo["flops"], count_params(run.model_config)
        tokens = train.total_steps * train.tokens_per_step
        row = {"job": "train", "run": run.id, "experiments": " ".join(run.experiments), "params": params,
               "layer_apps_per_token": round(prof.layer_applications_per_token, 2), "train_tokens": tokens,
               "train_flops": prof.flops_per_token * tokens, "gpu_memory_gib": train.gpu_memory_gib or None,
               "mfu": run_mfu(mfu, run.scale)}
        row.update(current)
        row["fits"] = None if not train.gpu_memory_gib else row["mem_gib"] <= train.gpu_memory_gib
        limit = limit_gib or train.gpu_memory_gib or None
        if limit:
            alts = alternatives(cfg, run, limit, mfu, peak_tflops, network, margin)
            pick = choose(alts)
            row["_alternatives"] = alts
            row.update(choice=pick and pick["setting"], choice_mem_gib=pick and pick["mem_gib"],
                       choice_step_s=pick and pick["step_s"],
                       agrees=bool(pick) and pick["setting"] == current["setting"])
        rows.append(row)
    return rows


def alternatives(cfg: PipelineConfig, run, limit_gib: float | None,
                 mfu: float | Callable[[str], float] = DEFAULT_MFU, peak_tflops: float = DEFAULT_PEAK_TFLOPS, network: Network = Network(),
                 margin: float = DEFAULT_MARGIN) -> list[dict]:
    """The run's strategies x micro-batches x checkpointing x loss chunking as :func:`plan_rows`'s
    columns, fastest first; ``fits``: within ``limit_gib`` less ``margin`` (None: not judged)."""
    tcfg = cfg.scales[run.scale].train
    current = Setting.of(tcfg)
    world = current.world
    strategies = [("ddp", "full"), ("fsdp", "full"), ("fsdp", "grad_op")] if world > 1 else [("ddp", "full")]
    if current.num_nodes > 1:
        strategies += [("fsdp", "hybrid"), ("fsdp", "hybrid_grad_op")]
    room = None if limit_gib is None else limit_gib * (1 - margin)
    rows, memo = [], {}
    for strategy, sharding in strategies:
        for mb in (1, 2, 4, 8):
            if tcfg.global_batch % (mb * world):
                continue
            for ckpt in ("none", "layer", "iteration"):
                for chunk in sorted({0, tcfg.seq_len, tcfg.loss_chunk_tokens}):
                    s = Setting.of(tcfg, strategy=strategy, fsdp_sharding=sharding, micro_batch=mb,
                                   activation_checkpointing=ckpt, loss_chunk_tokens=chunk)
                    row = {"run": run.id, **_run_plan(cfg, run, s, mfu, peak_tflops, network, memo)}
                    row["current"] = s.label == current.label
                    row["fits"] = None if room is None else row["mem_gib"] <= room
                    rows.append(row)
    return sorted(rows, key=lambda r: (r["wall_h"], r["mem_gib"]))


def _by_setting(rows: list[dict]) -> dict[str, list[dict]]:
    """The alternatives of ``rows`` (:func:`plan_rows`'s) grouped by setting label."""
    by_label: dict[str, list[dict]] = {}
    for alt in (alt for row in rows for alt in row["_alternatives"]):
        by_label.setdefault(alt["setting"], []).append(alt)
    return by_label


def choose_for_scale(rows: list[dict]) -> dict | None:
    """The one setting for all of a scale's runs (:func:`plan_rows`'s rows): of those every run fits,
    DDP where there is one, then the least GPU-hours; None where none fits them all."""
    every = [alts for alts in _by_setting(rows).values() if len(alts) == len(rows) and all(a["fits"] is not False for a in alts)]
    if not every:
        return None
    every.sort(key=lambda alts: (alts[0]["strategy"] == "fsdp", sum(a["gpu_hours"] for a in alts)))
    alts = every[0]
    return {"setting": alts[0]["setting"], "strategy": alts[0]["strategy"], "micro_batch": alts[0]["micro_batch"],
            "gpu_hours": sum(a["gpu_hours"] for a in alts), "mem_gib": max(a["mem_gib"] for a in alts),
            "agrees": all(a["current"] for a in alts)}


def choose(alts: list[dict]) -> dict | None:
    """The fastest DDP setting of :func:`alternatives` that fits, else the fastest sharded one; None:
    nothing fits. [choice] Sharding only where memory needs it (DDP is the path every verified run took)."""
    fits = [a for a in alts if a["fits"] is not False]
    return next((a for a in fits if a["strategy"] != "fsdp"), fits[0] if fits else None)


# ----------------------------------------------------------------------------------------------
# Printing: a table is a list of columns (header, width, format of a row); another job kind's rows
# print through the same function with its own columns.


def _fmt(value, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def _time_columns(unfit: str) -> list:
    """The columns a run's row and an alternative's share: time, jobs, GPU-hours, whether it fits."""
    return [
        ("step s", 8, lambda r: _fmt(r["step_s"], ".2f"), ">"),
        ("comm s", 8, lambda r: _fmt(r["comm_s"], ".3f"), ">"),
        ("wall h", 8, lambda r: _fmt(r["wall_h"], ".1f"), ">"),
        ("jobs", 5, lambda r: _fmt(r["jobs"], "d") if r["jobs"] != math.inf else "inf", ">"),
        ("GPU-h", 9, lambda r: _fmt(r["gpu_hours"], ".0f"), ">"),
        ("", 0, lambda r: "  " + ", ".join(x for x in (
            "" if r.get("fits") is None else ("fits" if r["fits"] else unfit), r["flag"]) if x), "<"),
    ]


TRAIN_COLUMNS = [
    ("run", 42, lambda r: r["run"], "<"),
    ("params (M)", 11, lambda r: _fmt(r["params"] / 1e6, ".1f"), ">"),
    ("layers/tok", 11, lambda r: _fmt(r["layer_apps_per_token"], "g"), ">"),
    ("tokens (B)", 11, lambda r: _fmt(r["train_tokens"] / 1e9, ".2f"), ">"),
    ("FLOPs", 10, lambda r: _fmt(r["train_flops"], ".2e"), ">"),
    ("GiB/GPU", 9, lambda r: _fmt(r["mem_gib"], ".1f"), ">"),
    ("limit", 7, lambda r: _fmt(r["gpu_memory_gib"], "g"), ">"),
] + _time_columns("DOES NOT FIT")

ALTERNATIVE_COLUMNS = [
    ("", 4, lambda r: ("*" if r.get("recommended") else "") + ("=" if r.get("current") else ""), "<"),
    ("setting", 44, lambda r: r["setting"], "<"),
    ("GiB/GPU", 9, lambda r: _fmt(r["mem_gib"], ".1f"), ">"),
] + _time_columns("does not fit")


CHOICE_COLUMNS = [
    ("run", 42, lambda r: r["run"], "<"),
    ("configured", 30, lambda r: r["setting"], "<"),
    ("GiB/GPU", 9, lambda r: _fmt(r["mem_gib"], ".1f"), ">"),
    ("  plan's choice", 32, lambda r: "  " + (r["choice"] or "nothing fits"), "<"),
    ("GiB/GPU", 9, lambda r: _fmt(r["choice_mem_gib"], ".1f"), ">"),
    ("step s", 8, lambda r: _fmt(r["choice_step_s"], ".2f"), ">"),
    ("", 0, lambda r: "  " + ("=" if r["agrees"] else "differs"), "<"),
]


def print_table(rows: list[dict], columns, indent: str = "") -> None:
    """Print ``rows`` under ``columns`` ((header, width, value of a row, alignment) each)."""
    print(indent + "".join(format(h, f"{a}{w}") for h, w, _, a in columns).rstrip())
    for r in rows:
        print(indent + "".join(format(str(v(r)), f"{a}{w}") for _, w, v, a in columns).rstrip())


def print_plan(cfg: PipelineConfig, experiments: list[str] | None, mfu: float | Callable[[str], float],
               peak_tflops: float, out: str | None = None, network: Network = Network(), compare: bool = False,
               limit_gib: float | None = None, top: int = 6, margin: float = DEFAULT_MARGIN,
               rows: list[dict] | None = None) -> int:
    """Print the rows of :func:`plan_rows` (``rows`` where already made), the totals, the plan's
    strategy per run against the config's and (``compare``) every run's alternatives; write the rows
    as CSV to ``out`` when given."""
    if rows is None:
        rows = plan_rows(cfg, experiments, mfu, peak_tflops, network, margin, limit_gib)
    print_table(rows, TRAIN_COLUMNS)
    at = f"MFU {mfu:.0%}" if not callable(mfu) else "the MFU above"
    print(f"\nTotals at {at} of {peak_tflops:g} TFLOP/s per GPU (training jobs, restarts included):")
    names = experiments or [n for n, e in cfg.experiments.items() if e.trained]
    for name, sel in [(n, [r for r in rows if n in r["experiments"].split()]) for n in names] + [("all (each once)", rows)]:
        print(f"  {name:<16}{len(sel):>4} runs {sum(r['train_flops'] for r in sel):>12.3e} FLOPs "
              f"{sum(r['gpu_hours'] for r in sel):>11.0f} GPU-h")
    print(f"\nGiB/GPU: the planned peak per device (weights, gradients, optimizer state; activations of the K "
          f"unrolled iterations; the loss's logits) + {ALLOWANCE_GIB:g} GiB + {ALLOWANCE_FRACTION:.0%} for the "
          f"allocator and workspaces (ops/memory.py); limit: train.gpu_memory_gib. step s: one optimiser step, "
          f"comm s of it the exposed gradient/parameter communication ({network.inter_node_gbps:g} Gb/s per node, "
          f"{network.intra_node_gbs:g} GB/s per GPU within a node). jobs: SLURM time limits of "
          f"resources.train.runtime the run spans (it requeues itself: docs/cluster.md).")
    chosen = [r for r in rows if "choice" in r]
    if chosen:
        print(f"\nStrategy per run (the fastest DDP setting within the limit less {margin:.0%}, else the fastest "
              f"sharded one; {sum(r['agrees'] for r in chosen)} of {len(chosen)} runs as configured):")
        print_table(chosen, CHOICE_COLUMNS, indent="  ")
        for scale in sorted({r["run"].split("/")[0] for r in chosen}):
            pick = choose_for_scale([r for r in chosen if r["run"].startswith(scale + "/")])
            if pick is None:
                print(f"  scale {scale}: no one setting fits all its runs with the margin")
                continue
            print(f"  scale {scale}: {pick['setting']} fits all its runs (at most {pick['mem_gib']:.1f} GiB, "
                  f"{pick['gpu_hours']:,.0f} GPU-h){'; the config has it' if pick['agrees'] else '; the config differs'}")
    if compare:
        for row in rows:
            run = next(r for r in expand_runs(cfg, experiments) if r.id == row["run"])
            limit = limit_gib or cfg.scales[run.scale].train.gpu_memory_gib or None
            alts = alternatives(cfg, run, limit, mfu, peak_tflops, network, margin)
            best = choose(alts)
            if best is not None:
                best["recommended"] = True
            shown = [a for a in alts if a["fits"] is not False][:top]
            shown += [a for a in alts if (a.get("current") or a.get("recommended")) and a not in shown]
            room = "" if limit is None else f" {limit:g} GiB less {margin:.0%}"
            print(f"\n{row['run']}: {len(alts)} settings, {sum(a['fits'] is not False for a in alts)} fit{room} "
                  f"(the fastest {top} shown; * the plan's choice: DDP where it fits, = the config's)")
            print_table(shown, ALTERNATIVE_COLUMNS, indent="  ")
    if out:
        fields = [k for k in rows[0] if not k.startswith("_")]
        _write_csv(out, [fields] + [[r.get(k) for k in fields] for r in rows])
    return sum(r["fits"] is False for r in rows)  # the runs over their train.gpu_memory_gib (commands/plan.py: exit 1)


# -- calibration: the memory plan against a GPU check's record (ops/memory.py's docstring) -----


def record_plans(pipeline: PipelineConfig, record: dict) -> dict[str, MemoryPlan]:
    """The plan of each model of a GPU check record's ``steps.train_410m_bf16`` (benchmarks/gpu_check.py)
    as that step trained: one device, bf16, logits alive through backward, the kernels it had."""
    step = record["steps"]["train_410m_bf16"]
    scale = pipeline.scales[step["scale"]]
    setting = Setting(micro_batch=step["micro_batch"], devices=1, num_nodes=1, precision="bf16-mixed", accumulation=1)
    kernels = bool(record.get("kernels", {}).get("mamba_ssm"))
    out = {}
    for name in step["models"]:
        cfg = run_model_config(scale, name, step["K"], get_spec(name).width(step["d_s"]))
        out[name] = plan_memory(cfg, step["seq_len"], setting, logits_kept=True, mamba_kernels=kernels)
    return out


# -- the documentation's figures: docs/tables/plan_<config>*.csv, rendered into the pages by
# scripts/results_doc.py and compared with a fresh plan by tests/test_docs.py ---------------------


def _span(values, spec: str) -> str:
    """``lo-hi`` of ``values`` (one figure where they agree as printed)."""
    lo, hi = _fmt(min(values), spec), _fmt(max(values), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _hours(value: float) -> str:
    """GPU-hours as the documentation prints them: whole hours, tenths below 100."""
    return _fmt(value, ",.0f" if value >= 100 else ".1f")


def _changed(alt: dict, current: dict) -> str | None:
    """Which one key ``alt`` changes from ``current``'s setting; "" for the setting itself, None for several."""
    keys = {"strategy": ("strategy", "fsdp_sharding"), "micro-batch": ("micro_batch",),
            "checkpointing": ("activation_checkpointing",), "loss": ("loss_chunk_tokens",)}
    changed = [name for name, ks in keys.items() if any(alt[k] != current[k] for k in ks)]
    return "" if not changed else (changed[0] if len(changed) == 1 else None)


def doc_tables(stem: str, rows: list[dict], mfu, peak_tflops: float, network: Network = Network(),
               margin: float = DEFAULT_MARGIN, analyses: list[dict] | None = None) -> dict[str, list[list[str]]]:
    """The plan of config ``stem`` as the documentation prints it: data files (header, rows) by name,
    a header ending in ":" right-aligned (scripts/results_doc.py). ``rows``: :func:`plan_rows`;
    ``mfu``: ops/mfu.py's PlanMfu (or a figure); ``analyses``: analysis_cost.analysis_plan_rows."""
    source = mfu.source if hasattr(mfu, "source") else f"MFU {mfu:g}"
    tables = {f"plan_{stem}_inputs.csv": [
        ["input", "value"],
        ["MFU", source],
        ["peak", f"{peak_tflops:g} TFLOP/s per GPU (dense bf16)"],
        ["links", f"{network.inter_node_gbps:g} Gb/s per node between nodes, {network.intra_node_gbs:g} GB/s per GPU "
                  f"within a node"],
        ["memory", f"the plan's peak + {ALLOWANCE_GIB:g} GiB + {ALLOWANCE_FRACTION:.0%}; a setting is chosen within "
                   f"train.gpu_memory_gib less {margin:.0%}"],
    ]}
    runs = [["run", "params (M):", "setting", "GiB/GPU:", "limit:", "step s:", "comm s:", "wall h:", "jobs:", "GPU-h:"]]
    for r in rows:
        runs.append([r["run"], _fmt(r["params"] / 1e6, ",.1f"), r["setting"], _fmt(r["mem_gib"], ".1f"),
                     _fmt(r["gpu_memory_gib"], "g"), _fmt(r["step_s"], ".2f"), _fmt(r["comm_s"], ".3f"),
                     _fmt(r["wall_h"], ".1f"), "inf" if r["jobs"] == math.inf else str(r["jobs"]),
                     _hours(r["gpu_hours"])])
    runs.append([f"all {len(rows)} runs", "", "", "", "", "", "", "", "", _hours(sum(r["gpu_hours"] for r in rows))])
    tables[f"plan_{stem}.csv"] = runs
    experiments = [["experiment", "runs:", "FLOPs:", "GPU-h:"]]
    names = list(dict.fromkeys(n for r in rows for n in r["experiments"].split()))
    for name, sel in [(n, [r for r in rows if n in r["experiments"].split()]) for n in names] + [("all (each once)", rows)]:
        experiments.append([name, str(len(sel)), _fmt(sum(r["train_flops"] for r in sel), ".2e"),
                            _hours(sum(r["gpu_hours"] for r in sel))])
    tables[f"plan_{stem}_experiments.csv"] = experiments
    chosen = [r for r in rows if "_alternatives" in r]
    if chosen:
        settings = [["scale", "setting", "changed", "runs within the limit less the margin:", "GiB/GPU:", "step s:",
                     "GPU-h:"]]
        for scale in sorted({r["run"].split("/")[0] for r in chosen}):
            mine = [r for r in chosen if r["run"].startswith(scale + "/")]
            current = mine[0]
            picked = []
            for label, alts in _by_setting(mine).items():
                what = _changed(alts[0], current)
                if what is None or len(alts) != len(mine):
                    continue
                mb = alts[0]["micro_batch"]
                if what == "micro-batch" and mb not in (current["micro_batch"] * 2, current["micro_batch"] // 2):
                    continue
                picked.append((what, label, alts))
            for what, label, alts in sorted(picked, key=lambda p: (p[0] != "", p[0], p[1])):
                fit = sum(a["fits"] is not False for a in alts)
                settings.append([scale, label, what or "as configured", f"{fit} of {len(alts)}",
                                 _span([a["mem_gib"] for a in alts], ".1f"), _span([a["step_s"] for a in alts], ".2f"),
                                 _hours(sum(a["gpu_hours"] for a in alts))])
        tables[f"plan_{stem}_settings.csv"] = settings
    if analyses:
        jobs = [["job", "jobs:", "hours each:", "limit h:", "within the limit:"]]
        for job in dict.fromkeys(a["job"] for a in analyses):
            sel = [a for a in analyses if a["job"] == job]
            hours = [a["hours"] for a in sel if a["hours"] is not None]
            fit = sum(a["fits"] is True for a in sel)
            jobs.append([job, str(len(sel)), _span(hours, ".1f") if hours else "?",
                         _span([a["limit_min"] / 60 for a in sel], ".1f"), f"{fit} of {len(sel)}"])
        tables[f"plan_{stem}_analyses.csv"] = jobs
    return tables


def write_doc_tables(tables: dict[str, list[list[str]]], folder) -> list[Path]:
    """Rewrite those of :func:`doc_tables`'s tables that ``folder`` has (the ones a page shows), or
    where it has none of them write them all; the paths written."""
    kept = [name for name in tables if (Path(folder) / name).is_file()]
    return [_write_csv(Path(folder) / name, tables[name]) for name in kept or list(tables)]


def _write_csv(path, table: list[list]) -> Path:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(table)
    atomic_write_bytes(path, buf.getvalue().encode())
    return Path(path)
