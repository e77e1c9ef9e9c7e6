"""Time per FLOP of the backbone's pieces and of the state branch's, forward + backward, side by side.

Why the mixers' training steps sit above their FLOP-share floor (issue 24): the floor assumes the
state branch runs at the backbone's average time per FLOP, and the backbone's average is mostly
its SwiGLU's three large matmuls. This prints, for one application of each piece at the model
shape of ``bench_forward_backward.py --layers 8 --width 512`` (batch 1 x 128 tokens, fp32, one
torch thread), its forward + backward time, its FLOPs (models/flops.py's counter) and its time
per FLOP against the SwiGLU sub-block's:

- the backbone's attention sub-block  x + Attn(RMSNorm(x)),
- the backbone's SwiGLU sub-block     x + SwiGLU(RMSNorm(x)),
- StateLoop's cell (eqs. 2, 5, 6)     S~ = cell(S, H),
- the attention mixer (eq. 8)         S + Attn(RMSNorm_m(S)),
- the Mamba-2 mixer (eq. 9)           S + Mamba2(RMSNorm(S)).

The pieces are timed in interleaved rounds (median), so load on the machine hits them alike.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_pieces.py [--width 512] [--seq 128] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forward_backward import config  # noqa: E402  (the same model shape)

from stateloop.models.backbone import Layer, Rotary  # noqa: E402
from stateloop.models.flops import counter  # noqa: E402
from stateloop.models.mixers import build_mixer  # noqa: E402
from stateloop.models.state import build_cell  # noqa: E402


def pieces(cfg) -> dict:
    """name -> (module, function of (module, x, rope) -> output)."""
    torch.manual_seed(0)
    layer = Layer(cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.head_dim, cfg.norm_eps, "torch")
    H = torch.randn(1, 1, cfg.d_model)  # broadcast over the tokens: the cell reads H^k per token
    cell = build_cell("ssm", cfg)
    return {
        "backbone attention": (layer, lambda m, x, r: x + m.attn(m.attn_norm(x), r)),
        "backbone SwiGLU": (layer, lambda m, x, r: x + m.ffn(m.ffn_norm(x))),
        "StateLoop cell": (cell, lambda m, x, r: m(x, H.expand_as(x))),
        "attention mixer": (build_mixer("attn", cfg), lambda m, x, r: m(x, r)),
        "Mamba-2 mixer": (build_mixer("mamba2", cfg), lambda m, x, r: m(x, r)),
    }


def fwd_bwd(module, fn, x, rope) -> None:
    fn(module, x, rope).sum().backward()
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
    flops = {}
    for name, (m, fn) in todo.items():
        with counter() as c:
            fwd_bwd(m, fn, x, rope)
        flops[name] = c.get_total_flops()
        fwd_bwd(m, fn, x, rope)  # warm-up
    times = {name: [] for name in todo}
    for _ in range(args.rounds):
        for name, (m, fn) in todo.items():
            t0 = time.perf_counter()
            for _ in range(args.inner):
                fwd_bwd(m, fn, x, rope)
            times[name].append((time.perf_counter() - t0) / args.inner)
    ref = statistics.median(times["backbone SwiGLU"]) / flops["backbone SwiGLU"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch 1 x {args.seq} tokens, fp32, d = d_s = "
          f"{args.width}; forward + backward, median of {args.rounds} interleaved rounds of {args.inner}")
    print(f"{'piece':<20}{'ms':>9}{'MFLOP':>10}{'GFLOP/s':>9}{'time/FLOP vs SwiGLU':>21}")
    for name in todo:
        t = statistics.median(times[name])
        print(f"{name:<20}{t * 1e3:>9.2f}{flops[name] / 1e6:>10.1f}{flops[name] / t / 1e9:>9.1f}"
              f"{t / flops[name] / ref:>21.2f}")


if __name__ == "__main__":
    main()
