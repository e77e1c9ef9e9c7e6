"""``stateloop plan --config CONFIG``: what training every run of a config costs.

For each run: parameters, decoder-layer applications per token (loop iterations unrolled),
training tokens (the scale's ``train`` budget), training FLOPs (forward + backward matmuls
counted on the meta device, models/flops.py) and GPU-hours at a given MFU and per-GPU peak.
Then totals per experiment (a run shared by several experiments counts in each) and overall
(each run once).
"""

from __future__ import annotations

import csv
import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="pipeline config (configs/*.yaml)")
    p.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    p.add_argument("--mfu", type=float, default=0.40, help="model FLOPs utilisation assumed (default 0.40)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="per-GPU peak, TFLOP/s (default 989: H100 SXM dense bf16)")
    p.add_argument("--out", help="also write the per-run rows as CSV here")


def plan_rows(cfg, experiments=None, mfu: float = 0.4, peak_tflops: float = 989.0) -> list[dict]:
    from stateloop.models.flops import compute_profile
    from stateloop.models.registry import count_params
    from stateloop.pipeline import expand_runs

    rows = []
    for run in expand_runs(cfg, experiments):  # each run once (expand_runs merges experiments)
        train = cfg.scales[run.scale].train
        prof, params = compute_profile(run.model_config, train.seq_len), count_params(run.model_config)
        tokens = train.total_steps * train.tokens_per_step
        flops = prof.flops_per_token * tokens
        rows.append({
            "run": run.id, "experiments": " ".join(run.experiments), "params": params,
            "layer_apps_per_token": round(prof.layer_applications_per_token, 2), "train_tokens": tokens,
            "train_flops": flops, "gpu_hours": flops / (mfu * peak_tflops * 1e12) / 3600,
        })
    return rows


def run(args) -> int:
    from stateloop.pipeline import load_pipeline

    if not 0 < args.mfu <= 1:
        print(f"stateloop plan: error: --mfu must be in (0, 1], got {args.mfu}", file=sys.stderr)
        return 2
    cfg = load_pipeline(args.config)
    rows = plan_rows(cfg, args.experiments, args.mfu, args.peak_tflops)
    print(f"{'run':<36}{'params (M)':>12}{'layers/tok':>11}{'tokens (B)':>12}{'train FLOPs':>13}{'GPU-h':>11}")
    for r in rows:
        print(f"{r['run']:<36}{r['params'] / 1e6:>12.2f}{r['layer_apps_per_token']:>11g}{r['train_tokens'] / 1e9:>12.3f}"
              f"{r['train_flops']:>13.3e}{r['gpu_hours']:>11.1f}")
    print(f"\nTotals at MFU {args.mfu:.0%} of {args.peak_tflops:g} TFLOP/s per GPU:")
    names = args.experiments or [n for n, e in cfg.experiments.items() if e.trained]
    for name in names:
        sel = [r for r in rows if name in r["experiments"].split()]
        print(f"  {name:<16}{len(sel):>4} runs {sum(r['train_flops'] for r in sel):>12.3e} FLOPs "
              f"{sum(r['gpu_hours'] for r in sel):>11.1f} GPU-h")
    print(f"  {'all (each once)':<16}{len(rows):>4} runs {sum(r['train_flops'] for r in rows):>12.3e} FLOPs "
          f"{sum(r['gpu_hours'] for r in rows):>11.1f} GPU-h")
    if args.out:
        import io

        from stateloop.runs import atomic_write_bytes

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_bytes(args.out, buf.getvalue().encode())
    return 0
