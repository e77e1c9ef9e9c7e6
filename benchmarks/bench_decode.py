"""Decode latency of the state branch on CPU, at a paper-shaped small config (Table 3's ratios).

Table 3 (1.4B, H200, BF16, P = N = 1024) reports per-token decoding latency relative to
Vanilla Looped at K = 4: StateLoop +1.4%, + Attention +2.1%, + Mamba-2 +1.8%, and Vanilla
Looped at K = 5 +25.0%. This script measures the same ratios side by side in one run on CPU at
the paper's shape scaled down in width:

    24 layers, d = d_s = 128, SwiGLU 344 (the paper's 2.6875 d), heads of 64 (2), K = 4;
    attention mixer 2 heads of 64; Mamba-2 mixer expand 2, state 128, conv 4, heads of 64, 1 group;
    vocabulary 4096, so the LM head is ~3% of the per-token multiply-adds, as at 1.4B (~2%).

The models decode in lockstep (``interleave="token"``: one token each in turn, order rotated
per step), so every model sees the same machine load to within a step. Two timing estimates of
the change relative to Vanilla Looped K=4 are printed: the median over runs of the per-run
latency ratio, and the ratio of the median single-step latencies (the more robust one when other
processes share the CPU). A third, load-free
measure counts the aten operators dispatched per decoded token (the CPU cost at this width is
dominated by per-operator overhead, as the paper's batch-1 GPU decoding is by kernel launches).

    PYTHONPATH=src python benchmarks/bench_decode.py --prefill 1024 --tokens 1024 --repeats 3  # the paper's P, N (~25 min)
    PYTHONPATH=src python benchmarks/bench_decode.py [--prefill 64 --tokens 64 --repeats 7]      # short context (~2 min)
    PYTHONPATH=src python benchmarks/bench_decode.py --layers 8 --width 512                      # wide and shallow

The context length changes the ratios: the backbone's K x L KV caches grow with it, the state
branch of StateLoop and Mamba-2 does not (benchmarks/records/2026-11-30-decode-latency-cpu.md has both settings).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stateloop.config.model import ModelConfig
from stateloop.fast import accelerate
from stateloop.models.cache import ModelCache
from stateloop.models.flops import decode_flops_per_token
from stateloop.models.registry import build_model
from stateloop.ops.bench_decode import BenchModel, bench_decode

SHAPE = dict(
    vocab_size=4096, n_layers=24, d_model=128, d_ff=344, n_heads=2, head_dim=64, max_seq_len=2048,
    mixer_heads=2, mixer_head_dim=64, mamba_expand=2, mamba_d_state=128, mamba_d_conv=4, mamba_head_dim=64,
    mamba_n_groups=1, attn_impl="torch", ssd_impl="torch",
)
ROWS = [  # (model, K, paper's latency change in %)
    ("vanilla_looped", 4, 0.0), ("vanilla_looped", 5, 25.0), ("stateloop", 4, 1.4), ("stateloop_attn", 4, 2.1),
    ("stateloop_mamba2", 4, 1.8),
]


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def ops_per_token(model, prefill: int) -> int:
    """aten operators dispatched by one decode step after a prefill (deterministic)."""
    cache = ModelCache()
    idx = torch.randint(0, model.cfg.vocab_size, (1, prefill))
    nxt = model(idx, cache=cache).logits[:, -1:].argmax(-1)
    nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
    with OpCounter() as counter:
        model(nxt, cache=cache)
    return counter.n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefill", type=int, default=64)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--mamba-d-state", type=int, default=SHAPE["mamba_d_state"],
                   help="Mamba-2 SSM state size N (paper: 128; 8 keeps the paper's 1.4B ratio of SSM state to layer weights)")
    p.add_argument("--layers", type=int, default=SHAPE["n_layers"], help="backbone layers (paper: 24)")
    p.add_argument("--width", type=int, default=SHAPE["d_model"],
                   help="d = d_s; SwiGLU 2.6875 d rounded to 8, heads of 64 (also the mixers')")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: least sensitive to other load)")
    p.add_argument("--json", help="also write the full result here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    d = args.width
    shape = {**SHAPE, "mamba_d_state": args.mamba_d_state, "n_layers": args.layers, "d_model": d,
             "d_ff": 8 * round(2.6875 * d / 8), "n_heads": d // 64, "mixer_heads": d // 64}
    for i, (name, K, _) in enumerate(ROWS):
        torch.manual_seed(i)
        cfg = ModelConfig(name=name, K=K, d_s=d if name.startswith("stateloop") else 0, **shape)
        rows.append(BenchModel(f"{name}:K{K}", accelerate(build_model(cfg).eval()), name, K, cfg.d_s, "untrained"))
    ops = {r.label: ops_per_token(r.model, args.prefill) for r in rows}
    result = bench_decode(rows, args.prefill, args.tokens, args.repeats, args.warmup, "cpu", interleave="token",
                          progress=sys.stderr.isatty())
    ref_ops = ops[rows[0].label]
    context = args.prefill + (args.tokens - 1) / 2  # the mean over the timed steps
    flops = {r.label: decode_flops_per_token(r.model.cfg, context) for r in rows}

    print(f"decode on {result['settings']['device']}, fp32, batch 1, P={args.prefill}, N={args.tokens}, "
          f"{args.repeats} lockstep runs (+{args.warmup} warm-up); {args.layers} layers, d = d_s = {d}, "
          f"Mamba-2 N={args.mamba_d_state}")
    print(f"{'model':<20} {'params':>7} {'ms/token':>14} {'change: runs':>12} {'steps':>8} {'floor':>7} {'x floor':>7} "
          f"{'paper':>7} {'ops/token':>9} {'ops':>8}")
    for (name, K, paper), r in zip(ROWS, result["rows"]):
        lat = r["latency_ms_per_token"]
        floor = 100 * (flops[r["label"]] / flops[rows[0].label] - 1)
        times = f"{r['latency_change_pct_median_step'] / floor:.2f}" if floor else ""
        print(f"{r['label']:<20} {r['params'] / 1e6:>6.2f}M {lat['median']:>7.2f} ± {lat['std']:<4.2f} "
              f"{r['latency_change_pct_median_of_runs']:>+11.2f}% {r['latency_change_pct_median_step']:>+7.2f}% "
              f"{floor:>+6.2f}% {times:>7} {paper:>+6.1f}% {ops[r['label']]:>9d} {100 * (ops[r['label']] / ref_ops - 1):>+7.2f}%")
    print("change: runs = median over runs of the per-run latency ratio; steps = ratio of the median single-step "
          "latencies; floor = change in FLOPs per decoded token (models/flops.py); x floor = steps / floor; "
          "ops = aten operators dispatched per decoded token")
    if args.json:
        result["ops_per_token"] = ops
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
