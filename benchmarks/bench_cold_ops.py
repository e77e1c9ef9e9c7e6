"""The state cell's operators timed inside decoded tokens and in a hot loop.

A decoded token streams the backbone's weights (about 100 MB per iteration at d = 512, 8 layers)
through the caches between two calls of the same cell operator, and one layer's weights between two
calls of a backbone operator. This script times each step of StateLoop's cell (eqs. 2, 5, 6) and
the SwiGLU's ``silu`` and product, per call, inside the tokens of a real decode; then the same calls
repeated on the same tensors, back to back (hot). The difference is what an operator pays for its
code and data being evicted between calls, which per-operator overhead on this CPU is mostly made of.

The cell and the SwiGLU are timed through a step-by-step copy of their forward, checked to give the
module's floats exactly before anything is timed; it never serves a model.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_cold_ops.py [--layers 8 --width 512] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import SHAPE  # noqa: E402  (the same model shape)

from stateloop.fast import accelerate  # noqa: E402
from stateloop.models.cache import ModelCache  # noqa: E402
from stateloop.models.config import ModelConfig  # noqa: E402
from stateloop.models.kernels import cast, rms_norm, upcast  # noqa: E402
from stateloop.models.registry import build_model  # noqa: E402

PIECES = (
    "cell RMSNorm",
    "cell [W_u; W_Delta] lookup",
    "cell product",
    "cell chunk",
    "softplus",
    "mul, exp",
    "lerp",
    "SwiGLU silu, mul",
)


def cell_steps(cell, S, H, spent: dict | None):
    """The cell's fused inference form (fast.selective_state_step, S^k given) one operator at a time;
    each step's seconds appended to ``spent[piece]`` when given. Returns S~^{k+1} and the step's inputs (for the hot loop)."""
    t = [time.perf_counter()]

    def mark():
        t.append(time.perf_counter())

    U = rms_norm(H, cell.norm_h.weight, cell.norm_h.eps)  # as the cell calls it (models/state.py)
    mark()
    W, b, neg_lambda = accelerate(cell)._fast_weights.get()
    mark()
    y = upcast(F.linear(U, W, b))
    mark()
    P, pre = y.chunk(2, dim=-1)
    mark()
    sp = F.softplus(pre)
    mark()
    g = torch.exp(sp * neg_lambda)
    mark()
    out = torch.lerp(P, cast(S, P.dtype), g)
    mark()
    if spent is not None:
        for piece, t0, t1 in zip(PIECES, t, t[1:]):
            spent[piece].append(t1 - t0)
    return out, dict(H=H, U=U, W=W, b=b, y=y, pre=pre, sp=sp, neg_lambda=neg_lambda, P=P, S=S, g=g)


def hot_calls(cell, x: dict, a, b_, n: int) -> dict[str, float]:
    """Seconds per call of each piece repeated ``n`` times on the same tensors."""
    calls = {
        "cell RMSNorm": lambda: rms_norm(x["H"], cell.norm_h.weight, cell.norm_h.eps),
        "cell [W_u; W_Delta] lookup": accelerate(cell)._fast_weights.get,
        "cell product": lambda: F.linear(x["U"], x["W"], x["b"]),
        "cell chunk": lambda: x["y"].chunk(2, dim=-1),
        "softplus": lambda: F.softplus(x["pre"]),
        "mul, exp": lambda: torch.exp(x["sp"] * x["neg_lambda"]),
        "lerp": lambda: torch.lerp(x["P"], x["S"], x["g"]),
        "SwiGLU silu, mul": lambda: F.silu(a) * b_,
    }
    out = {}
    for piece, call in calls.items():
        call()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        out[piece] = (time.perf_counter() - t0) / n
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512, help="d = d_s; SwiGLU 2.6875 d rounded to 8, heads of 64")
    ap.add_argument("--hot", type=int, default=200, help="calls of each piece in the hot loop")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    d = args.width
    shape = {**SHAPE, "n_layers": args.layers, "d_model": d, "d_ff": 8 * round(2.6875 * d / 8), "n_heads": d // 64}
    torch.manual_seed(0)
    model = accelerate(build_model(ModelConfig(name="stateloop", K=4, d_s=d, **shape)).eval())
    cell, ffn = model.cell, model.backbone.layers[0].ffn
    spent, last = defaultdict(list), {}

    with torch.inference_mode():  # the step-by-step copies give the modules' floats
        H, S = torch.randn(1, 3, d), torch.randn(1, 3, d)
        assert torch.equal(cell_steps(cell, S, H, None)[0], cell(S, H)), "the timed cell differs from the module"
        x = torch.randn(1, 3, d)

    module_cell_forward = cell.forward

    def timed_cell(S, H):
        if S is None:  # S^0 = 0: the module's own path (one operator fewer), not timed
            return module_cell_forward(S, H)
        out, last["cell"] = cell_steps(cell, S, H, spent)
        return out

    def timed_swiglu(layer_ffn):
        def forward(h):
            a, b_ = layer_ffn.w_gate(h), layer_ffn.w_up(h)
            t0 = time.perf_counter()
            y = F.silu(a) * b_
            spent["SwiGLU silu, mul"].append(time.perf_counter() - t0)
            last["ffn"] = (a, b_)
            return layer_ffn.w_down(y)

        return forward

    with torch.inference_mode():
        reference = ffn(x)
        ffn.forward = timed_swiglu(ffn)
        assert torch.equal(ffn(x), reference), "the timed SwiGLU differs from the module"
        for layer in model.backbone.layers[1:]:
            layer.ffn.forward = timed_swiglu(layer.ffn)
        cell.forward = timed_cell
        cache = ModelCache()
        nxt = model(torch.randint(0, shape["vocab_size"], (1, args.prefill)), cache=cache).logits[:, -1:].argmax(-1)
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
        token = (time.perf_counter() - t0) / args.tokens
        hot = hot_calls(cell, last["cell"], *last["ffn"], args.hot)
    print(
        f"torch {torch.__version__}, 1 thread, fp32, batch 1; StateLoop, {args.layers} layers, d = d_s = {d}, K = 4; "
        f"{args.tokens} tokens after {args.prefill}: {1e3 * token:.2f} ms a token"
    )
    print(f"{'piece':<28}{'in a token (us, median)':>25}{'hot (us)':>10}{'ratio':>8}")
    for piece in PIECES:
        cold = statistics.median(spent[piece])
        print(f"{piece:<28}{1e6 * cold:>25.1f}{1e6 * hot[piece]:>10.1f}{cold / hot[piece]:>8.2f}")
    print(
        "in a token: each call inside the decoded tokens (the cell from its second iteration on, S^k given); "
        "hot: the same call repeated on the same tensors"
    )


if __name__ == "__main__":
    main()
