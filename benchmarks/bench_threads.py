"""Two torch processes side by side on one machine, each with torch's default thread pool (all
cores) against each with its share of the cores (``OMP_NUM_THREADS`` = cores / 2).

``scripts/test.sh`` runs two pytest processes at once, and Snakemake runs several jobs at once;
torch's OpenMP threads spin while they wait, so two pools that each span every core slow small
operations far more than they share. Each process repeats a small workload for a fixed time:
one forward and backward pass of a tiny StateLoop (d = 64, K = 4, 64 tokens) and a bare
(512 x 32) @ (32 x 32) matmul. Printed: per-iteration time of each setting (the mean of the two
processes) and the ratio default / shared.

    PYTHONPATH=src python benchmarks/bench_threads.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORK = r"""
import json, sys, time, torch
from stateloop.config.model import ModelConfig
from stateloop.models.registry import build_model
seconds = float(sys.argv[1])
cfg = ModelConfig(name="stateloop", vocab_size=256, d_model=64, n_layers=2, n_heads=4, head_dim=16, d_ff=172,
                  max_seq_len=64, K=4, d_s=64)
model = build_model(cfg)
idx = torch.randint(0, 256, (1, 64))
a, w = torch.randn(512, 32), torch.randn(32, 32)
out = {"threads": torch.get_num_threads()}
for name, step in (("train step", lambda: model(idx).logits.sum().backward()), ("small matmul", lambda: a @ w)):
    step()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    out[name] = (time.perf_counter() - t0) / n
print(json.dumps(out))
"""


def side_by_side(threads: int | None, seconds: float) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    procs = [subprocess.Popen([sys.executable, "-c", WORK, str(seconds)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [json.loads(p.communicate()[0]) for p in procs]
    return {k: sum(r[k] for r in results) / 2 for k in results[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    default = side_by_side(None, args.seconds)
    shared = side_by_side(max(1, cores // 2), args.seconds)
    print(f"{cores} cores; two processes side by side, {args.seconds:.0f} s each; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'workload':<14} {'default threads':>22} {'cores/2 threads':>22} {'ratio':>7}")
    for name in ("train step", "small matmul"):
        d, s = default[name], shared[name]
        print(f"{name:<14} {d * 1e3:>14.3f} ms ({default['threads']:.0f} thr) {s * 1e3:>14.3f} ms ({shared['threads']:.0f} thr) "
              f"{d / s:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
