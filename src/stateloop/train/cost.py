"""What training every run of a pipeline config costs (``stateloop plan``): per run, parameters,
decoder-layer applications per token, training tokens, training FLOPs (models/flops.py) and
GPU-hours at a given MFU and per-GPU peak; totals per experiment and overall (each run once)."""

from __future__ import annotations

import csv

from stateloop.pipeline import PipelineConfig, expand_runs


def plan_rows(cfg: PipelineConfig, experiments=None, mfu: float = 0.4, peak_tflops: float = 989.0) -> list[dict]:
    """One row per run of the chosen experiments (default: every trained one)."""
    from stateloop.models.flops import compute_profile
    from stateloop.models.registry import count_params

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


def print_plan(cfg: PipelineConfig, experiments: list[str] | None, mfu: float, peak_tflops: float,
               out: str | None = None) -> int:
    """Print the rows of :func:`plan_rows` and the totals; write the rows as CSV to ``out`` when given."""
    rows = plan_rows(cfg, experiments, mfu, peak_tflops)
    print(f"{'run':<36}{'params (M)':>12}{'layers/tok':>11}{'tokens (B)':>12}{'train FLOPs':>13}{'GPU-h':>11}")
    for r in rows:
        print(f"{r['run']:<36}{r['params'] / 1e6:>12.2f}{r['layer_apps_per_token']:>11g}{r['train_tokens'] / 1e9:>12.3f}"
              f"{r['train_flops']:>13.3e}{r['gpu_hours']:>11.1f}")
    print(f"\nTotals at MFU {mfu:.0%} of {peak_tflops:g} TFLOP/s per GPU:")
    names = experiments or [n for n, e in cfg.experiments.items() if e.trained]
    for name in names:
        sel = [r for r in rows if name in r["experiments"].split()]
        print(f"  {name:<16}{len(sel):>4} runs {sum(r['train_flops'] for r in sel):>12.3e} FLOPs "
              f"{sum(r['gpu_hours'] for r in sel):>11.1f} GPU-h")
    print(f"  {'all (each once)':<16}{len(rows):>4} runs {sum(r['train_flops'] for r in rows):>12.3e} FLOPs "
          f"{sum(r['gpu_hours'] for r in rows):>11.1f} GPU-h")
    if out:
        import io

        from stateloop.runs import atomic_write_bytes

        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_bytes(out, buf.getvalue().encode())
    return 0
