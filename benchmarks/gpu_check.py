"""The GPU check, in one run of at most ~8 minutes on one CUDA GPU: what only a GPU can show.

    python3 benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json
    python3 benchmarks/gpu_check.py --smoke          # the same steps at rehearsal sizes, on any device

Needs torch, lightning, pyyaml, tqdm, pytest (a GPU image's usual set; no mlflow, lm-eval or
Snakemake) and, for the fused kernels, the `gpu` extra (flash-attn, mamba-ssm, causal-conv1d);
where those are absent the pure-PyTorch paths run and the JSON says so. ``--mamba-ssm-src DIR``
(an unpacked mamba-ssm sdist) imports mamba_ssm's Triton kernels where its CUDA extensions were
never built: every mamba_ssm function this project calls (the chunked SSD scan, the decode
recurrence, the gated RMSNorm) is Triton, but the package's ``__init__`` imports Mamba-1's CUDA
extension and transformers, so the check registers the package without running that file.
Steps, in this order, the JSON rewritten after each (a kill keeps what finished):

1. ``matmul_peak``: an 8192^3 bf16 product, the measured ceiling MFU is also given against;
2. ``train_410m_bf16``: bf16 training steps of the 410M Vanilla Looped, StateLoop and its
   attention and Mamba-2 variants at Table 4's K and d_s (seq 2048): AdamW, bf16 autocast;
   tokens/s, MFU, and each state branch's step time over Vanilla's beside its FLOP-share floor
   (the ratio of counted FLOPs). The models run in blocks A B C D D C B A so drift hits all alike;
3. ``decode_1.4b_bf16``: Table 3 at the 1.4B shapes: per-token decoding latency at batch 1 in bf16
   weights after a 1024-token prefill, relative to Vanilla Looped K = 4, with the FLOP floors,
   the models interleaved as the DAG's Table 3 job does (the config's ``bench.interleave``);
4. ``ssd_1.4b``: the SSD scan's forward + backward at the 1.4B mixer's shape, mamba_ssm's kernel
   against the pure-PyTorch twin (time and difference), where mamba_ssm imports;
5. ``gpu_tests``: ``pytest -m gpu`` in this process (the fused kernels against their twins).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def use_mamba_ssm_sources(src: Path) -> dict:
    """Make ``import mamba_ssm.ops.triton...`` load from an unpacked sdist without running the
    package's ``__init__`` (which imports Mamba-1's CUDA extension, Mamba-3 and transformers).
    Must run before :mod:`stateloop.models.kernels` is imported."""

    pkg_dir = src / "mamba_ssm"
    if not (pkg_dir / "ops" / "triton" / "ssd_combined.py").is_file():
        raise SystemExit(f"--mamba-ssm-src {src}: no mamba_ssm/ops/triton/ssd_combined.py there")
    if "stateloop.models.kernels" in sys.modules:
        raise RuntimeError("use_mamba_ssm_sources must run before stateloop.models.kernels is imported")
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [str(pkg_dir)]
    sys.modules["mamba_ssm"] = pkg
    found = re.search(r'__version__\s*=\s*"([^"]+)"', (pkg_dir / "__init__.py").read_text())
    return {"source": str(src), "version": found.group(1) if found else None, "package_init_run": False}


def load_paper(smoke: bool):
    from stateloop.config import load_yaml
    from stateloop.pipeline import pipeline_from_dict

    raw = load_yaml(ROOT / "configs" / "paper.yaml")
    if smoke:
        from stateloop.ops.rehearse.config import shrink

        raw = shrink(raw)
    return pipeline_from_dict(raw, "configs/paper.yaml" + (" (rehearsal sizes)" if smoke else ""))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def kernels_found() -> dict:
    from stateloop.models import kernels

    return {
        "flash_attn": kernels.HAS_FLASH_ATTN,
        "mamba_ssm": kernels.HAS_MAMBA_SSM,
        "mamba_decode": kernels.HAS_MAMBA_DECODE,
        "causal_conv1d": kernels.HAS_CAUSAL_CONV1D,
    }


def matmul_peak(device: torch.device, n: int, reps: int = 10) -> dict:
    """Dense bf16 (fp32 on CPU) matrix products of n x n x n: the ceiling actually reached here."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    seconds = (time.perf_counter() - t0) / reps
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "seconds": seconds, "flops_per_s": 2 * n**3 / seconds}


def train_bench(
    cfg, models: list[str], micro: int, seq: int, steps: int, warmup: int, device: torch.device, measured_peak: float | None
) -> dict:
    """Step times of Table 4's shape (scale, K, d_s) for each model, in blocks A B .. B A."""
    from stateloop.models.flops import compute_profile
    from stateloop.models.registry import get_spec
    from stateloop.pipeline import run_model_config
    from stateloop.train.flops import peak_flops

    exp = cfg.experiments["table4"]
    scale, K, d_s = cfg.scales[exp.scale], exp.K[0], exp.d_s[0]
    configs = {m: run_model_config(scale, m, K, get_spec(m).width(d_s)) for m in models}
    seq = min(seq, scale.model.max_seq_len)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    times: dict[str, list[float]] = {m: [] for m in models}
    losses: dict[str, list[float]] = {m: [] for m in models}
    errors: dict[str, str] = {}
    for name in models + models[::-1]:
        if name in errors:
            continue
        try:
            t, loss = _train_block(configs[name], micro, seq, steps, warmup, device, autocast)
        except Exception as err:  # one model's failure (a kernel, memory) leaves the others' figures
            errors[name] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        times[name].append(t)
        losses[name].append(loss)
    models = [m for m in models if m not in errors]
    peak = peak_flops(device, "bf16-mixed")
    out = {
        "scale": exp.scale,
        "K": K,
        "d_s": d_s,
        "micro_batch": micro,
        "seq_len": seq,
        "steps": steps,
        "warmup": warmup,
        "peak_flops_datasheet": peak,
        "peak_flops_measured": measured_peak,
        "models": {},
        "errors": errors,
    }
    for name in models:
        step = min(times[name])  # the least disturbed of the two blocks
        flops = compute_profile(configs[name], seq).flops_per_token
        tok_s = micro * seq / step
        out["models"][name] = {
            "step_s": times[name],
            "tokens_per_s": tok_s,
            "train_flops_per_token": flops,
            "last_loss": losses[name],
            "mfu": flops * tok_s / peak if peak else None,
            "mfu_of_measured_peak": flops * tok_s / measured_peak if measured_peak else None,
        }
    if not models or models[0] != "vanilla_looped":
        return out
    base = out["models"][models[0]]
    for name in models[1:]:
        row = out["models"][name]
        ratio = min(times[name]) / min(times[models[0]])
        floor = row["train_flops_per_token"] / base["train_flops_per_token"]
        row.update(
            {"step_time_over_" + models[0]: ratio, "flop_floor": floor, "x_floor": (ratio - 1) / (floor - 1) if floor != 1 else None}
        )
    if device.type == "cuda":
        out["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def _train_block(model_cfg, micro: int, seq: int, steps: int, warmup: int, device: torch.device, autocast):
    """Seconds per optimiser step of one freshly built model (after ``warmup`` steps), last loss."""
    from stateloop.models.registry import build_model

    torch.manual_seed(0)
    model = build_model(model_cfg, device=device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    x = torch.randint(0, model.cfg.vocab_size, (micro, seq + 1), device=device)
    for i in range(warmup + steps):
        if i == warmup:
            sync(device)
            t0 = time.perf_counter()
        with autocast:
            logits = model(x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync(device)
    return (time.perf_counter() - t0) / steps, float(loss.detach())


def decode_bench(cfg, prefill: int, tokens: int, runs: int, device: torch.device, interleave: str) -> dict:
    from stateloop.analysis.bench_decode import bench_decode, untrained_row
    from stateloop.models import kernels
    from stateloop.pipeline import expand_runs

    exp = cfg.experiments["decoding"]
    scale_model = cfg.scales[exp.scale].model
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = [
        untrained_row(scale_model, f"{r.model}:{r.K}" + (f":{r.d_s}" if r.d_s else ""), device, dtype)
        for r in expand_runs(cfg, ["decoding"])
    ]
    ref = next(r.label for r in rows if r.label == "vanilla_looped:K4")
    try:
        result = bench_decode(
            rows, prefill, tokens, runs=runs, warmup=1, device=device, reference=ref, progress=False, interleave=interleave
        )
        result["kernels"] = kernels_found()
        return result
    except Exception as err:  # a fused kernel failing: time the pure-PyTorch paths instead, and say so
        if not (kernels.HAS_MAMBA_SSM or kernels.HAS_MAMBA_DECODE or kernels.HAS_FLASH_ATTN):
            raise
        failed = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    found = (kernels.HAS_MAMBA_SSM, kernels.HAS_MAMBA_DECODE, kernels.HAS_FLASH_ATTN)
    kernels.HAS_MAMBA_SSM = kernels.HAS_MAMBA_DECODE = kernels.HAS_FLASH_ATTN = False
    try:  # the later steps still see the kernels
        result = bench_decode(
            rows, prefill, tokens, runs=runs, warmup=1, device=device, reference=ref, progress=False, interleave=interleave
        )
        result["kernels"] = kernels_found()
    finally:
        kernels.HAS_MAMBA_SSM, kernels.HAS_MAMBA_DECODE, kernels.HAS_FLASH_ATTN = found
    result["kernel_error"] = failed
    return result


def ssd_bench(cfg, seq: int, batch: int, reps: int, device: torch.device) -> dict:
    """The SSD scan's forward + backward at the decoding scale's Mamba-2 mixer shape: mamba_ssm's
    kernel against the pure-PyTorch twin, both in bf16, and each against the twin in float32."""
    from stateloop.models import kernels

    m = cfg.scales[cfg.experiments["decoding"].scale].model
    heads = m.mamba_expand * m.d_model // m.mamba_head_dim
    shape = {
        "batch": batch,
        "seq": seq,
        "heads": heads,
        "head_dim": m.mamba_head_dim,
        "groups": m.mamba_n_groups,
        "d_state": m.mamba_d_state,
        "chunk": m.mamba_chunk_size,
    }
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def rnd(*size):
        return torch.randn(*size, device=device, generator=g)

    x = rnd(batch, seq, heads, m.mamba_head_dim)
    dt = F.softplus(rnd(batch, seq, heads) - 2)
    A = -torch.exp(rnd(heads) * 0.5)
    B, C = rnd(batch, seq, m.mamba_n_groups, m.mamba_d_state), rnd(batch, seq, m.mamba_n_groups, m.mamba_d_state)
    grad = rnd(batch, seq, heads, m.mamba_head_dim)
    ref = kernels.ssd(x, dt, A, B, C, m.mamba_chunk_size, impl="torch")
    impls = ["torch"] + (["kernel"] if kernels.HAS_MAMBA_SSM and device.type == "cuda" else [])
    out = {"shape": shape, "dtype": str(dtype).replace("torch.", ""), "impls": {}}
    for impl in impls:
        ins = [t.to(dtype).requires_grad_() for t in (x, dt, B, C)]

        def step(ins=ins, impl=impl):
            y = kernels.ssd(ins[0], ins[1], A, ins[2], ins[3], m.mamba_chunk_size, impl=impl)
            y.backward(grad.to(dtype))
            return y

        for _ in range(2):
            y = step()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        sync(device)
        out["impls"][impl] = {
            "fwd_bwd_ms": (time.perf_counter() - t0) / reps * 1e3,
            "max_rel_diff_vs_fp32_twin": float((y.detach().float() - ref).abs().max() / ref.abs().max()),
        }
    if len(impls) == 2:
        out["kernel_over_torch"] = out["impls"]["kernel"]["fwd_bwd_ms"] / out["impls"]["torch"]["fwd_bwd_ms"]
    return out


def gpu_tests() -> dict:
    """``pytest -m gpu`` in this process, so that --mamba-ssm-src's import holds there too."""
    import contextlib
    import io

    import pytest

    t0 = time.perf_counter()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = pytest.main(["-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", str(ROOT / "tests/models/test_kernels_gpu.py")])
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    return {
        "returncode": int(code),
        "summary": lines[-1] if lines else "",
        "seconds": time.perf_counter() - t0,
        "output_tail": "\n".join(lines[-40:]),
    }


def summary(name: str, result: dict) -> str:
    """One line per step for the log (the JSON holds everything)."""
    if "error" in result:
        return f"{name}: ERROR {result['error']}"
    if name == "matmul_peak":
        return f"{name}: {result['flops_per_s'] / 1e12:.1f} TFLOP/s ({result['dtype']}, n = {result['n']})"
    if name == "train_410m_bf16":
        parts = []
        for m, r in result["models"].items():
            extra = f", x{r['x_floor']:.2f} of floor {r['flop_floor']:.3f}" if r.get("x_floor") is not None else ""
            mfu = f", MFU {r['mfu']:.3f}" if r["mfu"] else ""
            parts.append(f"{m} {min(r['step_s']):.3f} s/step{mfu}{extra}")
        return f"{name}: " + "; ".join(parts)
    if name == "decode_1.4b_bf16":
        return f"{name}: " + "; ".join(
            f"{r['label']} {r['latency_ms_per_token']['mean']:.2f} ms ({r['latency_change_pct']:+.1f}%)" for r in result["rows"]
        )
    if name == "ssd_1.4b":
        return f"{name}: " + "; ".join(
            f"{k} {v['fwd_bwd_ms']:.2f} ms (rel diff {v['max_rel_diff_vs_fp32_twin']:.1e})" for k, v in result["impls"].items()
        )
    return f"{name}: {result.get('summary', '')}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    p.add_argument("--smoke", action="store_true", help="rehearsal sizes (any device): check that the script runs")
    p.add_argument("--mamba-ssm-src", type=Path, help="an unpacked mamba-ssm sdist: its Triton kernels without its CUDA build")
    p.add_argument("--train-models", default="vanilla_looped,stateloop,stateloop_attn,stateloop_mamba2")
    p.add_argument("--micro", type=int, default=4, help="training micro-batch (sequences)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--train-steps", type=int, default=6)
    p.add_argument("--decode-prefill", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--decode-runs", type=int, default=3)
    p.add_argument(
        "--decode-interleave",
        choices=("run", "token"),
        help="run: whole runs in turn; token: the models in lockstep (default: the config's bench.interleave)",
    )
    p.add_argument("--ssd-seq", type=int, default=2048)
    p.add_argument("--mamba-chunk", type=int, help="the SSD chunk length for every model and the scan (default: the config's)")
    p.add_argument("--skip", default="", help="comma-separated steps to leave out")
    args = p.parse_args(argv)
    mamba_src = use_mamba_ssm_sources(args.mamba_ssm_src) if args.mamba_ssm_src else None
    if args.smoke:
        args.micro, args.seq, args.train_steps = 1, 32, 2
        args.decode_prefill, args.decode_tokens, args.decode_runs, args.ssd_seq = 16, 4, 2, 64
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_paper(args.smoke)
    if args.mamba_chunk:  # a [choice] (models/config.py): mamba_ssm's kernels are tuned for 256
        for scale in cfg.scales.values():
            scale.model = dataclasses.replace(scale.model, mamba_chunk_size=args.mamba_chunk)
    report = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "smoke": args.smoke,
        "settings": vars(args),
        "mamba_ssm_sources": mamba_src,
        "kernels": kernels_found(),
        "steps": {},
    }
    from stateloop.files import atomic_write_json

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"device {report['device']}, torch {torch.__version__}, kernels {report['kernels']}", file=sys.stderr, flush=True)
    t_all = time.perf_counter()
    skip = {s for s in args.skip.split(",") if s}
    steps = {
        "matmul_peak": lambda: matmul_peak(device, 512 if args.smoke else 8192),
        "train_410m_bf16": lambda: train_bench(
            cfg,
            args.train_models.split(","),
            args.micro,
            args.seq,
            args.train_steps,
            2,
            device,
            report["steps"].get("matmul_peak", {}).get("flops_per_s"),
        ),
        "decode_1.4b_bf16": lambda: decode_bench(
            cfg,
            args.decode_prefill,
            args.decode_tokens,
            args.decode_runs,
            device,
            args.decode_interleave or cfg.bench.interleave,
        ),
        "ssd_1.4b": lambda: ssd_bench(cfg, args.ssd_seq, 1, 2 if args.smoke else 10, device),
        "gpu_tests": gpu_tests,
    }
    if skip - set(steps):
        raise SystemExit(f"--skip: unknown steps {sorted(skip - set(steps))} (steps: {', '.join(steps)})")
    for name, step in steps.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            report["steps"][name] = step()
        except Exception as err:  # recorded; the other steps still run
            report["steps"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
        report["steps"][name]["wall_s"] = time.perf_counter() - t0
        report["wall_s"] = time.perf_counter() - t_all
        atomic_write_json(out, report)  # after every step: a kill keeps what finished
        print(f"[{report['wall_s']:.0f} s] {summary(name, report['steps'][name])}", file=sys.stderr, flush=True)
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all("error" not in s for s in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
