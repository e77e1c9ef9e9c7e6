"""Time per FLOP of the backbone's pieces and of the state branch's, forward + backward, side by side.

Why the mixers' training steps sit above their FLOP-share floor: the floor assumes the
state branch runs at the backbone's time per FLOP. This prints, for one application of each piece
at the model shape of ``bench_forward_backward.py --layers 8 --width 512`` (batch 1 x 128 tokens,
fp32, one torch thread), its forward + backward time, its FLOPs (models/flops.py's counter) and
its time per FLOP against the SwiGLU sub-block's:

- a backbone layer                    x + Attn(RMSNorm(x)), then + SwiGLU(RMSNorm(.)),
- its attention sub-block             x + Attn(RMSNorm(x)),
- its SwiGLU sub-block                x + SwiGLU(RMSNorm(x)),
- StateLoop's cell (eqs. 2, 5, 6)     S~ = cell(S, H),
- a read (eqs. 3, 4)                  H + RMSNorm_s(S) W_{s->z}^T,
- the attention mixer (eq. 8)         S + Attn(RMSNorm_m(S)),
- the Mamba-2 mixer (eq. 9)           S + Mamba2(RMSNorm(S)).

Then, per variant, the state branch of one iteration (cell, mixer, read) against its floor: its
time per FLOP over the backbone layer's. That ratio is the branch's overhead over its FLOP share
(overhead / floor = (t_branch / t_backbone) / (F_branch / F_backbone)), measured on the pieces
themselves rather than as a small difference of two whole training steps.

Each backward starts from a fixed random gradient of the piece's output (a loss's gradient is a
dense tensor; ``.sum().backward()`` would hand every piece a stride-0 one). The pieces are timed in
interleaved rounds (median), so load on the machine hits them alike.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_pieces.py [--width 512] [--seq 128] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward_backward import config  # noqa: E402  (the same model shape)

from stateloop.models.backbone import Layer, RMSNorm, Rotary  # noqa: E402
from stateloop.models.flops import counter  # noqa: E402
from stateloop.models.mixers import build_mixer  # noqa: E402
from stateloop.models.state import build_cell  # noqa: E402


def pieces(cfg) -> dict:
    """name -> (module, function of (module, x, rope) -> output)."""
    torch.manual_seed(0)
    layer = Layer(cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.head_dim, cfg.norm_eps, "torch")
    H = torch.randn(1, 1, cfg.d_model)  # broadcast over the tokens: the cell reads H^k per token
    read = nn.ModuleDict({"norm_s": RMSNorm(cfg.d_s, cfg.norm_eps), "W_sz": nn.Linear(cfg.d_s, cfg.d_model, bias=False)})
    return {
        "backbone layer": (layer, lambda m, x, r: m(x, r)),
        "backbone attention": (layer, lambda m, x, r: x + m.attn(m.attn_norm(x), r)),
        "backbone SwiGLU": (layer, lambda m, x, r: x + m.ffn(m.ffn_norm(x))),
        "StateLoop cell": (build_cell("ssm", cfg), lambda m, x, r: m(x, H.expand_as(x))),
        "read": (read, lambda m, x, r: H + m["W_sz"](m["norm_s"](x))),
        "attention mixer": (build_mixer("attn", cfg), lambda m, x, r: m(x, r)),
        "Mamba-2 mixer": (build_mixer("mamba2", cfg), lambda m, x, r: m(x, r)),
    }


# Each variant's state branch in one iteration, as pieces of the table.
BRANCHES = {"stateloop": ("StateLoop cell", "read"), "stateloop_attn": ("StateLoop cell", "attention mixer", "read"),
            "stateloop_mamba2": ("StateLoop cell", "Mamba-2 mixer", "read")}


def fwd_bwd(module, fn, x, rope, grad) -> None:
    fn(module, x, rope).backward(grad)
    module.zero_grad(set_to_none=True)
    x.grad = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512, help="d = d_s")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5, help="calls per timed block")
    args = ap.parse_args()
    cfg = config("stateloop_mamba2", 4096, 8, args.width)  # config() gives every model the same mixer widths
    rope = Rotary(args.seq, 0, cfg.head_dim, cfg.rope_theta, "cpu", torch.float32)
    x = torch.randn(1, args.seq, args.width, requires_grad=True)
    todo = pieces(cfg)
    flops, grads = {}, {}
    for name, (m, fn) in todo.items():
        grads[name] = torch.randn(fn(m, x, rope).shape)
        with counter() as c:
            fwd_bwd(m, fn, x, rope, grads[name])
        flops[name] = c.get_total_flops()
        fwd_bwd(m, fn, x, rope, grads[name])  # warm-up
    times = {name: [] for name in todo}
    for _ in range(args.rounds):
        for name, (m, fn) in todo.items():
            t0 = time.perf_counter()
            for _ in range(args.inner):
                fwd_bwd(m, fn, x, rope, grads[name])
            times[name].append((time.perf_counter() - t0) / args.inner)
    t = {name: statistics.median(v) for name, v in times.items()}
    ref = t["backbone SwiGLU"] / flops["backbone SwiGLU"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch 1 x {args.seq} tokens, fp32, d = d_s = "
          f"{args.width}; forward + backward, median of {args.rounds} interleaved rounds of {args.inner}")
    print(f"{'piece':<20}{'ms':>9}{'MFLOP':>10}{'GFLOP/s':>9}{'time/FLOP vs SwiGLU':>21}")
    for name in todo:
        print(f"{name:<20}{t[name] * 1e3:>9.2f}{flops[name] / 1e6:>10.1f}{flops[name] / t[name] / 1e9:>9.1f}"
              f"{t[name] / flops[name] / ref:>21.2f}")
    layer = t["backbone layer"] / flops["backbone layer"]
    print("\nthe state branch of one iteration against its floor (its time per FLOP over a backbone layer's; quartiles "
          "over the rounds, each round's pieces against its own layer):")
    for variant, parts in BRANCHES.items():
        bt, bf = sum(t[p] for p in parts), sum(flops[p] for p in parts)
        per_round = [sum(times[p][i] for p in parts) / bf / (times["backbone layer"][i] / flops["backbone layer"])
                     for i in range(args.rounds)]
        q = statistics.quantiles(per_round, n=4) if args.rounds >= 4 else (float("nan"),) * 3
        print(f"{variant:<20}{bt * 1e3:>9.2f}{bf / 1e6:>10.1f}{bf / bt / 1e9:>9.1f}{'x floor':>12}{bt / bf / layer:>9.2f}"
              f"  ({q[0]:.2f}, {q[2]:.2f})")


if __name__ == "__main__":
    main()
