"""Decoding latency (paper, Table 3): per-token latency and throughput at batch size 1.

Protocol (paper: BF16, batch 1, a 1024-token prefill followed by a 1024-token continuation,
five runs, mean and standard deviation): a timed run is a fresh cache, the prompt in one pass
(prefill, timed apart), then N greedy single-token steps; latency = decode time / N, the clock
read after a device sync. Warm-up runs come first; the timed runs of all models are interleaved
round-robin (or token by token: ``interleave="token"``), so that drift in machine load spreads
over every model. Relative latency is against the reference row (the first unless named). The
prompt is seeded random tokens: latency does not depend on the values, so untrained models of a
shape time as trained ones.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from stateloop.analysis.request import DecodeRequest
from stateloop.config import ConfigError, from_dict, merge, parse_dotlist, to_dict
from stateloop.config.model import ModelConfig
from stateloop.config.pipeline import BenchConfig, PipelineConfig, ScaleConfig
from stateloop.experiments import PAPER_MODELS, decoding_specs, run_model_config, scale_of
from stateloop.fast import accelerate
from stateloop.files import atomic_write_json, code_version
from stateloop.models.flops import decode_flops_per_token
from stateloop.models.generate import greedy_steps, model_logits
from stateloop.models.registry import build_model, get_spec
from stateloop.runs import load_model, resolve_device, resolve_run_arg

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Table 3's loop counts: K = 4, and K = 5 for Vanilla Looped as well. Its models are the paper's
# decoding experiment's (pipeline.PAPER_MODELS); models with a state use d_s = d (the paper's 1.4B setting).
TABLE3_K = 4
TABLE3_K_BY_MODEL = {"vanilla_looped": [4, 5]}


def table3_rows() -> list[tuple[str, int]]:
    """Table 3's rows as (model, K), in the paper's order."""
    return [(name, K) for name in PAPER_MODELS["decoding"] for K in TABLE3_K_BY_MODEL.get(name, [TABLE3_K])]


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA (the paper's setting), float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"--dtype: unknown dtype {name!r} (auto, {', '.join(DTYPES)})")
    return DTYPES[name]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class BenchModel:
    """One row of the benchmark: a built model and how it was obtained."""

    label: str
    model: torch.nn.Module
    name: str
    K: int
    d_s: int
    source: str  # a run folder, or "untrained"
    params: int = field(init=False)

    def __post_init__(self):
        self.params = sum(p.numel() for p in self.model.parameters())


@torch.inference_mode()
def time_decode(model, prompt: torch.Tensor, n_new: int, device: torch.device) -> tuple[float, float]:
    """One run: (prefill seconds, decode seconds for n_new single-token steps)."""
    steps = greedy_steps(model_logits(model), prompt)
    synchronize(device)
    t0 = time.perf_counter()
    next(steps)  # prefill
    synchronize(device)
    t1 = time.perf_counter()
    for _ in range(n_new):
        next(steps)
    synchronize(device)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


@torch.inference_mode()
def time_decode_lockstep(models: list, prompt: torch.Tensor, n_new: int, device: torch.device):
    """One run of several models in lockstep: every model prefills, then each decode step is
    taken by every model in turn (order rotated per step), each step timed on its own.
    Returns per model (prefill seconds, [seconds of each decode step]). Models see the same
    machine load to within one step, which makes the ratios of their latencies robust on a
    shared CPU."""
    steps = [greedy_steps(model_logits(model), prompt) for model in models]
    pre, dec = [0.0] * len(models), [[] for _ in models]
    for i, gen in enumerate(steps):
        synchronize(device)
        t0 = time.perf_counter()
        next(gen)  # prefill
        synchronize(device)
        pre[i] = time.perf_counter() - t0
    order = list(range(len(models)))
    for step in range(n_new):
        shift = step % len(models)
        for i in order[shift:] + order[:shift]:
            t0 = time.perf_counter()
            next(steps[i])
            synchronize(device)
            dec[i].append(time.perf_counter() - t0)
    return list(zip(pre, dec))


def _summary(values: list[float]) -> dict:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "median": statistics.median(values), "min": min(values),
            "runs": values}


def bench_decode(rows: list[BenchModel], prefill: int, n_new: int, runs: int = 5, warmup: int = 1,
                 device: str | torch.device = "cpu", reference: str | None = None, seed: int = 0,
                 progress: bool = True, interleave: str = "run") -> dict:
    """Time every row's decoding side by side; return the result dict written as JSON.

    ``interleave="run"`` (the paper's protocol, the default): whole runs round-robin across the
    models. ``interleave="token"``: the models decode in lockstep, one token each in turn
    (:func:`time_decode_lockstep`), with a device sync after every step; best for ratios on a
    busy CPU, not for absolute GPU latency (the per-step sync removes host/device overlap).
    Models must already sit on ``device`` in the benchmark dtype, in eval mode.
    """
    check_settings(rows, prefill, n_new, runs, warmup, interleave)
    device = torch.device(device)
    ref = _reference_label(rows, reference)
    vocab = min(r.model.cfg.vocab_size for r in rows)
    prompt = torch.randint(0, vocab, (1, prefill), generator=torch.Generator().manual_seed(seed)).to(device)
    timings = _time_rows(rows, prompt, n_new, runs, warmup, device, progress, interleave)
    results = [_row_result(row, timings[row.label], n_new) for row in rows]
    _add_latency_changes(results, ref)
    _add_flop_floors(results, rows, prefill, n_new, ref)
    if interleave == "token":
        _add_step_changes(results, ref, timings)
    return {
        "benchmark": "decode",
        "settings": {
            "batch_size": 1, "prefill_tokens": prefill, "new_tokens": n_new, "runs": runs, "warmup": warmup,
            "dtype": str(next(rows[0].model.parameters()).dtype).replace("torch.", ""), "device": device_name(device),
            "reference": ref, "seed": seed, "interleave": interleave,
        },
        "environment": environment(),
        "rows": results,
    }


def check_settings(rows: list[BenchModel], prefill: int, n_new: int, runs: int, warmup: int, interleave: str) -> None:
    if not rows:
        raise ValueError("no models to benchmark")
    if prefill < 1 or n_new < 1 or runs < 1 or warmup < 0:
        raise ConfigError(f"need prefill >= 1, tokens >= 1, runs >= 1, warmup >= 0; got {prefill}, {n_new}, {runs}, {warmup}")
    if interleave not in ("run", "token"):
        raise ValueError(f"interleave must be 'run' or 'token', got {interleave!r}")
    for row in rows:  # a prompt longer than the model's context: positions it was never built for
        if prefill > row.model.cfg.max_seq_len:
            raise ConfigError(f"--prefill {prefill}: longer than the context of {row.label} "
                              f"(model.max_seq_len = {row.model.cfg.max_seq_len})")


def _reference_label(rows: list[BenchModel], reference: str | None) -> str:
    """The row the relative latencies are taken against: ``reference``, else the first row."""
    labels = [r.label for r in rows]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--models: the same model is listed twice ({labels})")
    ref = reference if reference is not None else labels[0]
    if ref not in labels:
        raise ConfigError(f"--reference {ref!r} is not one of the rows ({', '.join(labels)})")
    return ref


def _time_rows(rows: list[BenchModel], prompt: torch.Tensor, n_new: int, runs: int, warmup: int,
               device: torch.device, progress: bool, interleave: str) -> dict:
    """The warm-up runs, then the timed runs. Returns per row label the timings of the timed runs:
    prefill and decode seconds per run, and in lockstep every step's seconds and each run's median step."""
    from tqdm import tqdm

    timings = {r.label: {"prefill": [], "decode": [], "steps": [], "run_medians": []} for r in rows}
    per_rep = len(rows) if interleave == "run" else 1
    with tqdm(total=(warmup + runs) * per_rep, desc="bench decode", unit="run", disable=not progress,
              dynamic_ncols=True) as bar:
        for rep in range(warmup + runs):
            what = "warm-up" if rep < warmup else f"run {rep - warmup + 1}/{runs}"
            if interleave == "token":
                bar.set_postfix_str(f"{what}, {len(rows)} models in lockstep")
                measured = zip(rows, time_decode_lockstep([r.model for r in rows], prompt, n_new, device))
                bar.update()
            else:
                shift = rep % len(rows)
                measured = []
                for row in rows[shift:] + rows[:shift]:  # rotate the order each run
                    bar.set_postfix_str(f"{what} {row.label}")
                    measured.append((row, time_decode(row.model, prompt, n_new, device)))
                    bar.update()
            if rep >= warmup:
                _record(timings, measured)
    return timings


def _record(timings: dict, measured) -> None:
    """Add one timed run, (row, (prefill seconds, decode seconds or lockstep step seconds)) per row."""
    for row, (pre, dec) in measured:
        t = timings[row.label]
        t["prefill"].append(pre)
        if isinstance(dec, list):  # lockstep: the time of every step
            t["steps"].extend(dec)
            t["run_medians"].append(statistics.median(dec))
            dec = sum(dec)
        t["decode"].append(dec)


def _row_result(row: BenchModel, t: dict, n_new: int) -> dict:
    """A row of the result: the model, its per-token latency, throughput and prefill time over the runs."""
    per_token_ms = [1000.0 * d / n_new for d in t["decode"]]
    return {
        "label": row.label, "model": row.name, "K": row.K, "d_s": row.d_s, "source": row.source,
        "params": row.params, "params_m": round(row.params / 1e6, 2),
        "latency_ms_per_token": _summary(per_token_ms),
        "throughput_tok_s": _summary([n_new / d for d in t["decode"]]),
        "prefill_ms": _summary([1000.0 * p for p in t["prefill"]]),
    }


def _add_latency_changes(results: list[dict], ref: str) -> None:
    """Each row's latency change against the reference row: of the mean, and the median of the per-run ratios."""
    by_label = {r["label"]: r for r in results}
    ref_lat = by_label[ref]["latency_ms_per_token"]
    for r in results:
        lat = r["latency_ms_per_token"]
        r["latency_change_pct"] = 100.0 * (lat["mean"] / ref_lat["mean"] - 1.0)
        # Per-run ratios to the reference's run with the same index (same machine state when
        # interleaved); their median is the noise-robust estimate of the relative latency.
        ratios = [a / b for a, b in zip(lat["runs"], ref_lat["runs"])]
        r["latency_change_pct_median_of_runs"] = 100.0 * (statistics.median(ratios) - 1.0)


def _add_flop_floors(results: list[dict], rows: list[BenchModel], prefill: int, n_new: int, ref: str) -> None:
    """Each row's FLOPs per decoded token (models/flops.py: matmuls, attention over the cache) and
    their change against the reference row: the *floor* of its latency change, what the change
    would be if time followed arithmetic alone. The timed steps see P to P + N - 1 cached tokens
    and the count is linear in the context, so it is taken at their mean. Rows of models the count
    does not cover (trained baselines) get none, and no row does without the reference's."""
    flops = {r["label"]: decode_flops_per_token(row.model.cfg, prefill + (n_new - 1) / 2) for r, row in zip(results, rows)}
    if flops[ref] is None:
        return
    for r in results:
        if flops[r["label"]] is not None:
            r["decode_flops_per_token"] = flops[r["label"]]
            r["flops_change_pct"] = 100.0 * (flops[r["label"]] / flops[ref] - 1.0)


def _add_step_changes(results: list[dict], ref: str, timings: dict) -> None:
    """Lockstep: the typical (median) single-step latency of each model, immune to the bursts of
    foreign load that inflate whole runs; its ratio is the most robust change on a busy CPU."""
    ref_step = statistics.median(timings[ref]["steps"])
    for r in results:
        med = statistics.median(timings[r["label"]]["steps"])
        r["step_ms_median"] = 1000.0 * med
        r["latency_change_pct_median_step"] = 100.0 * (med / ref_step - 1.0)
        # each timed run's median step: the per-run samples the claims pair run by run
        r["step_ms_median_runs"] = [1000.0 * m for m in timings[r["label"]]["run_medians"]]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment() -> dict:

    return {"torch": torch.__version__, "python": platform.python_version(), "code_version": code_version()}


def parse_model_spec(spec: str) -> tuple[str, int | None, int | None]:
    """``name``, ``name:K`` or ``name:K:d_s`` -> (name, K or None, d_s or None)."""
    parts = spec.split(":")
    if len(parts) > 3 or not parts[0]:
        raise ConfigError(f"--models: {spec!r} must look like name, name:K or name:K:d_s")
    try:
        nums = [int(p) for p in parts[1:]]
    except ValueError:
        raise ConfigError(f"--models: {spec!r} must look like name, name:K or name:K:d_s (integers)") from None
    return parts[0], (nums[0] if nums else None), (nums[1] if len(nums) > 1 else None)


def untrained_row(scale_model, spec: str, device, dtype) -> BenchModel:
    """A randomly initialised model of the scale's shape with the spec's name, K and d_s
    (d_s defaults to d for models with a state)."""

    name, K, d_s = parse_model_spec(spec)
    model_spec = get_spec(name)
    K = scale_model.K if K is None else K
    d_s = model_spec.width(scale_model.d_model if d_s is None else d_s)
    cfg = run_model_config(ScaleConfig(model=scale_model), name, K, d_s)
    model = accelerate(build_model(cfg, device=device).to(dtype=dtype).eval())
    label = f"{name}:K{K}" + (f":ds{d_s}" if model_spec.has_state else "")
    return BenchModel(label, model, name, K, d_s, "untrained")


def run_row(run_dir, device, dtype) -> BenchModel:
    """A trained run's model, from its folder."""

    model, _ = load_model(run_dir, device=device)
    model = accelerate(model.to(dtype=dtype).eval())
    cfg = model.cfg
    label = f"{cfg.name}:K{cfg.K}" + (f":ds{cfg.d_s}" if cfg.d_s else "")
    return BenchModel(label, model, cfg.name, cfg.K, cfg.d_s, str(run_dir))


def format_table(result: dict) -> str:
    """A plain-text table of the result (printed by the command)."""
    lines = [f"{'model':<34} {'params(M)':>10} {'ms/token':>16} {'tok/s':>9} {'change':>8} {'FLOP floor':>10}"]
    for r in result["rows"]:
        lat = r["latency_ms_per_token"]
        lines.append(f"{r['label']:<34} {r['params_m']:>10.2f} {lat['mean']:>9.3f} ± {lat['std']:<5.3f}"
                     f"{r['throughput_tok_s']['mean']:>9.2f} {r['latency_change_pct']:>+7.2f}%"
                     + (f" {r['flops_change_pct']:>+9.2f}%" if "flops_change_pct" in r else ""))
    return "\n".join(lines)

# ----------------------------------------------------------------------------------------------
# The stage: what `stateloop bench decode` runs (its request: analysis/request.py)


BENCH_KEYS = ("prefill", "tokens", "repeats", "warmup", "dtype", "interleave")  # flags that override the bench section


def _bench_settings(args: DecodeRequest, pipeline: PipelineConfig | None) -> BenchConfig:
    """The config's ``bench:`` section (BenchConfig's defaults without --config), then the flags given."""
    flags = {key: getattr(args, key) for key in BENCH_KEYS if getattr(args, key) is not None}
    return from_dict(BenchConfig, merge(to_dict(pipeline.bench) if pipeline else {}, flags), "bench")


def _bench_scale(args: DecodeRequest, pipeline: PipelineConfig | None) -> str | None:
    """The scale whose shape untrained rows take: --scale, else the config's decoding experiment's."""
    if pipeline is None:
        if args.scale:
            raise ConfigError("--scale: needs --config")
        return None
    if args.scale:
        return args.scale
    if "decoding" not in pipeline.experiments:
        raise ConfigError(f"--scale: required with --config ({args.config} has no decoding experiment)")
    return pipeline.experiments["decoding"].scale


def _specs(args: DecodeRequest, pipeline: PipelineConfig | None) -> list[str]:
    """The untrained rows: --models; without them and without --runs, the config's decoding
    experiment (unless --scale picks another scale), else Table 3's rows."""
    if args.models or args.runs:
        return list(args.models)
    if pipeline is not None and not args.scale and "decoding" in pipeline.experiments:
        return decoding_specs(pipeline)
    return [f"{name}:{K}" for name, K in table3_rows()]


def _scale_model(args: DecodeRequest, pipeline: PipelineConfig | None) -> ModelConfig:
    """The ModelConfig untrained rows are built from: the scale's model section (or the
    defaults, which are the paper's 1.4B shape) with --set overrides."""
    scale = _bench_scale(args, pipeline)
    base = scale_of(pipeline, scale, f"{args.config}: scales.{scale}: not defined").model if scale else ModelConfig()
    overrides = parse_dotlist(args.overrides)
    if set(overrides) - {"model"}:
        raise ConfigError(f"--set: {next(iter(set(overrides) - {'model'}))}: only model.* keys shape a benchmark model")
    return from_dict(ModelConfig, merge(to_dict(base), overrides.get("model", {})), "model")


def run_stage(args: DecodeRequest, pipeline: PipelineConfig | None = None) -> int:
    """``stateloop bench decode``: build the rows, time them, write the JSON and print the table.
    ``pipeline``: the config ``args.config`` names, loaded by the command (None without one)."""
    run_dirs = [resolve_run_arg(r, "--runs").folder for r in args.runs]  # every RUN checked before any loads
    bench = _bench_settings(args, pipeline)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(bench.dtype, device)
    specs = _specs(args, pipeline)
    rows = [run_row(d, device, dtype) for d in run_dirs]
    if specs:
        shape = _scale_model(args, pipeline)
        for i, spec in enumerate(specs):
            torch.manual_seed(args.seed + i)
            rows.append(untrained_row(shape, spec, device, dtype))
    check_settings(rows, bench.prefill, bench.tokens, bench.repeats, bench.warmup, bench.interleave)  # before any output
    print(f"bench decode: {len(rows)} models on {device_name(device)}, {str(dtype).replace('torch.', '')}, "
          f"P={bench.prefill} N={bench.tokens}, {bench.warmup} warm-up + {bench.repeats} timed runs each", file=sys.stderr)
    result = bench_decode(rows, bench.prefill, bench.tokens, bench.repeats, bench.warmup, device,
                          args.reference, args.seed, progress=not args.no_progress, interleave=bench.interleave)
    atomic_write_json(args.out, result)
    print(format_table(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
