"""The GPU check, in one run of at most ~8 minutes on one CUDA GPU: what only a GPU can show.

    python3 benchmarks/gpu_check.py --out benchmarks/results/gpu_check.json
    python3 benchmarks/gpu_check.py --smoke          # the same steps at rehearsal sizes, on any device

Needs torch, lightning, pyyaml, tqdm (a GPU image's usual set; no mlflow, lm-eval or Snakemake)
and, for the fused kernels, the `gpu` extra (flash-attn, mamba-ssm, causal-conv1d); where those
cannot be built the pure-PyTorch paths are timed and the JSON says so. Steps:

1. ``pytest -m gpu``: the fused kernels against their pure-PyTorch twins (skips what is absent);
2. bf16 training steps of the 410M Vanilla Looped and StateLoop at K = 7 (configs/paper.yaml's
   Table 4 shapes, seq 2048): AdamW, bf16 autocast, a micro-batch that fits (``--micro``);
   tokens/s, MFU against the device's dense bf16 peak, and the state branch's cost as the
   ratio of step times. The two models alternate A B B A so drift hits both alike;
3. Table 3 at the 1.4B shapes: per-token decoding latency at batch 1 in bf16 after a 1024-token
   prefill (``--decode-tokens`` new tokens, ``--decode-runs`` runs, interleaved), relative to
   Vanilla Looped K = 4.

Everything lands in one JSON (``--out``); a failed step is recorded with its error and the
others still run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def load_paper(smoke: bool):
    from stateloop.config import load_yaml
    from stateloop.pipeline import pipeline_from_dict

    raw = load_yaml(ROOT / "configs" / "paper.yaml")
    if smoke:
        from stateloop.rehearse.config import shrink

        raw = shrink(raw)
    return pipeline_from_dict(raw, "configs/paper.yaml" + (" (rehearsal sizes)" if smoke else ""))


def gpu_tests(timeout: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                           "tests/models/test_kernels_gpu.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return {"returncode": proc.returncode, "summary": lines[-1] if lines else "", "seconds": time.perf_counter() - t0,
            "output_tail": "\n".join(lines[-30:])}


def train_bench(cfg, micro: int, seq: int, steps: int, warmup: int, device: torch.device) -> dict:
    """Step time of the 410M vanilla_looped and stateloop at K = 7, alternating A B B A."""
    from stateloop.models.flops import compute_profile
    from stateloop.models.registry import build_model
    from stateloop.pipeline import expand_runs
    from stateloop.train.flops import peak_flops

    runs = {r.model: r for r in expand_runs(cfg, ["table4"]) if r.model in ("vanilla_looped", "stateloop")}
    seq = min(seq, runs["stateloop"].model_config.max_seq_len)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    times: dict[str, list[float]] = {m: [] for m in runs}
    for name in ("vanilla_looped", "stateloop", "stateloop", "vanilla_looped"):
        torch.manual_seed(0)
        model = build_model(runs[name].model_config, device=device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
        x = torch.randint(0, model.cfg.vocab_size, (micro, seq + 1), device=device)
        for i in range(warmup + steps):
            if i == warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            with autocast:
                logits = model(x[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times[name].append((time.perf_counter() - t0) / steps)
        del model, opt, logits, loss
        if device.type == "cuda":
            torch.cuda.empty_cache()
    peak = peak_flops(device, "bf16-mixed")
    out = {"micro_batch": micro, "seq_len": seq, "steps": steps, "warmup": warmup, "peak_flops": peak, "models": {}}
    for name, run in runs.items():
        step = min(times[name])  # the least disturbed of the two blocks
        flops = compute_profile(dataclasses.replace(run.model_config), seq).flops_per_token
        tok_s = micro * seq / step
        out["models"][name] = {"run": run.id, "step_s": times[name], "tokens_per_s": tok_s,
                               "mfu": flops * tok_s / peak if peak else None, "train_flops_per_token": flops}
    out["stateloop_over_vanilla_step_time"] = min(times["stateloop"]) / min(times["vanilla_looped"])
    if device.type == "cuda":
        out["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def decode_bench(cfg, prefill: int, tokens: int, runs: int, device: torch.device) -> dict:
    from stateloop.analysis.bench_decode import bench_decode, untrained_row
    from stateloop.pipeline import expand_runs

    exp = cfg.experiments["decoding"]
    scale_model = cfg.scales[exp.scale].model
    dtype = torch.bfloat16
    rows = [untrained_row(scale_model, f"{r.model}:{r.K}" + (f":{r.d_s}" if r.d_s else ""), device, dtype)
            for r in expand_runs(cfg, ["decoding"])]
    ref = next(r.label for r in rows if r.label == "vanilla_looped:K4")
    result = bench_decode(rows, prefill, tokens, runs=runs, warmup=1, device=device, reference=ref, progress=False)
    from stateloop.models import kernels

    result["kernels"] = {"flash_attn": kernels.HAS_FLASH_ATTN, "mamba_ssm": kernels.HAS_MAMBA_SSM,
                         "mamba_decode": kernels.HAS_MAMBA_DECODE}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check.json"))
    p.add_argument("--smoke", action="store_true", help="rehearsal sizes (any device): check that the script runs")
    p.add_argument("--micro", type=int, default=4, help="training micro-batch (sequences)")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--train-steps", type=int, default=8)
    p.add_argument("--decode-prefill", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--decode-runs", type=int, default=3)
    p.add_argument("--skip-tests", action="store_true")
    args = p.parse_args(argv)
    if args.smoke:
        args.micro, args.seq, args.train_steps = 1, 32, 2
        args.decode_prefill, args.decode_tokens, args.decode_runs = 16, 4, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = load_paper(args.smoke)
    report = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "smoke": args.smoke, "settings": vars(args), "steps": {}}
    t_all = time.perf_counter()
    steps = [("decode_1.4b_bf16", lambda: decode_bench(cfg, args.decode_prefill, args.decode_tokens, args.decode_runs, device)),
             ("train_410m_bf16", lambda: train_bench(cfg, args.micro, args.seq, args.train_steps, 2, device))]
    if not args.skip_tests:
        steps.insert(0, ("gpu_tests", lambda: gpu_tests(timeout=180)))
    for name, step in steps:
        t0 = time.perf_counter()
        try:
            report["steps"][name] = step()
        except Exception as err:  # recorded; the other steps still run
            report["steps"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
        report["steps"][name]["wall_s"] = time.perf_counter() - t0
        print(f"{name}: {report['steps'][name]['wall_s']:.1f} s", file=sys.stderr)
    report["wall_s"] = time.perf_counter() - t_all
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    os.replace(tmp, out)
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all("error" not in s for s in report["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
