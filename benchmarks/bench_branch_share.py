"""The state branch's share of each decoded token, timed inside the model.

``bench_decode.py`` measures the branch as the difference of two models' latencies, timed in
lockstep; at d = 512, 8 layers a token takes about 60 ms and the branch a few, so on a shared
2-core machine (per-token spread of several ms) its x floor moves by 0.1-1 from run to run. Here
each StateLoop variant decodes alone, and inside every decoded token the time spent in the state
branch (the cell, eqs. 2, 5, 6; the mixer, eqs. 7-9; the reads, eqs. 3, 4 and 10) is summed by
timers wrapped around those calls; the rest of the token (embedding, K backbone applications,
head) is the backbone's side. Both sides of a ratio then come from the same token, so load on the
machine hits them alike. Per token:

    x floor = (t_branch / t_rest) / (F_branch / F_rest)

with F_rest the FLOPs of Vanilla Looped's decoded token and F_branch the variant's extra FLOPs
at that context (models/flops.py's ``decode_flops_per_token``): the branch's time over its
arithmetic share, as in ``bench_decode.py``. The residual adds H + R of the reads fall on the
backbone's side (two elementwise adds per iteration); the timers' own cost (about 0.3 us a call,
3 calls per iteration) on the branch's.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_branch_share.py [--layers 8 --width 512] [--tokens 64] [--plain]

The same score is given to the backbone's own pieces, timed the same way inside Vanilla Looped's
tokens: ``vanilla:attention`` (each layer's pre-norm and attention, eq. 8's computation on the
hidden state) and ``vanilla:swiglu`` (each layer's pre-norm and SwiGLU), each as if it were a
branch added to the rest of the token: (t_piece / t_rest) / (F_piece / F_rest). They are the
like-for-like reference: the attention mixer is the backbone's attention class applied to the
state, so it cannot score below ``vanilla:attention`` without being written differently.

``--plain`` adds a row "stateloop:plain": a second StateLoop with the same weights whose cell
(eqs. 2, 5, 6) and reads (eqs. 3, 4, 10) run as closures over tensors taken once, the same
operators with no module calls, attribute lookups, weight-cache keys or dtype checks (decoding
only; its logits are checked equal to the module's first). It measures how much of the branch's
time is Python around the operators, not a path the models take.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode import SHAPE  # noqa: E402  (the same model shape)

from stateloop.fast import accelerate, cell_weights  # noqa: E402
from stateloop.models.cache import ModelCache  # noqa: E402
from stateloop.models.config import ModelConfig  # noqa: E402
from stateloop.models.flops import decode_flops_per_token  # noqa: E402
from stateloop.models.registry import build_model  # noqa: E402

VARIANTS = ("stateloop", "stateloop_attn", "stateloop_mamba2")


class BranchClock:
    """Sums the time spent in the calls it wraps."""

    def __init__(self) -> None:
        self.spent = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.spent += time.perf_counter() - t0
            return out

        return timed


def wrap_branch(model, wrap) -> None:
    """The model's state-branch calls (cell, mixer, reads) replaced by ``wrap`` of each, once per
    model (instance attributes: ``nn.Module.__call__`` finds them first). bench_train_share.py
    wraps the same calls."""
    model.cell.forward = wrap(model.cell.forward)
    model.mixer.forward = wrap(model.mixer.forward)
    model.read = wrap(model.read)


BACKBONE_PIECES = {"attention": ("attn_norm", "attn"), "swiglu": ("ffn_norm", "ffn")}


def wrap_backbone_piece(model, piece: str, wrap) -> None:
    """One sub-block of every backbone layer, its pre-norm and its attention or SwiGLU, replaced
    by ``wrap`` of each call (the residual add stays outside, as the reads' adds do)."""
    for layer in model.backbone.layers:
        for part in BACKBONE_PIECES[piece]:
            module = getattr(layer, part)
            module.forward = wrap(module.forward)


def instrument(model) -> BranchClock:
    """Timers around the model's branch calls."""
    clock = BranchClock()
    wrap_branch(model, clock.wrap)
    return clock


def instrument_backbone(model, piece: str) -> BranchClock:
    """Timers around one sub-block of every backbone layer."""
    clock = BranchClock()
    wrap_backbone_piece(model, piece, clock.wrap)
    return clock


def backbone_piece_flops(cfg, piece: str, context: float) -> float:
    """FLOPs of one backbone sub-block per decoded token, all K applications of all layers:
    q, k, v, o and QK^T, AV over context + 1 keys; or SwiGLU's three products (models/flops.py's
    ``decode_flops_per_token`` is their sum plus the head's, checked in tests/test_benchmarks.py)."""
    d, inner = cfg.d_model, cfg.n_heads * cfg.head_dim
    per_layer = 2 * 4 * d * inner + 4 * (context + 1) * inner if piece == "attention" else 2 * 3 * d * cfg.d_ff
    return cfg.K * cfg.n_layers * per_layer


def plain_stateloop(model) -> None:
    """Replace ``model``'s cell and reads by closures over its current tensors (fp32, decoding only,
    no read masks): the bound for a branch with no Python around its operators (module docstring)."""
    cell, d_s = model.cell, model.cfg.d_s
    with torch.no_grad():
        W, b, neg_lambda = (t.clone() for t in cell_weights(cell))
    g_h, g_s, eps = cell.norm_h.weight.detach(), model.norm_s.weight.detach(), cell.norm_h.eps
    d = g_h.numel()
    linear, rms_norm, softplus, exp, lerp, addcmul = F.linear, torch.rms_norm, F.softplus, torch.exp, torch.lerp, torch.addcmul

    def cell_forward(S, H):
        P, pre = linear(rms_norm(H, (d,), g_h, eps), W, b).chunk(2, -1)  # (2), (5)
        g = exp(softplus(pre) * neg_lambda)  # (6)
        return addcmul(P, g, P, value=-1.0) if S is None else lerp(P, S, g)

    weights = {id(model.W_sz): model.W_sz.weight.detach(), id(model.W_sout): model.W_sout.weight.detach()}

    def read(Wm, S, keep):
        return linear(rms_norm(S, (d_s,), g_s, eps), weights[id(Wm)])  # (3)

    cell.forward, model.read = cell_forward, read


@torch.inference_mode()
def decode_shares(model, clocks: list[BranchClock], prefill: int, tokens: int) -> list[tuple[int, float, list[float]]]:
    """(context, token seconds, seconds in each clock's calls) of each decoded token after a prefill."""
    cache = ModelCache()
    idx = torch.randint(0, model.cfg.vocab_size, (1, prefill))
    nxt = model(idx, cache=cache).logits[:, -1:].argmax(-1)
    out = []
    for i in range(tokens):
        for clock in clocks:
            clock.spent = 0.0
        t0 = time.perf_counter()
        nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
        out.append((prefill + i, time.perf_counter() - t0, [clock.spent for clock in clocks]))
    return out


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3); one value is all three (bench_train_share.py's single round)."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else (xs[0],) * 3
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="decodes of --tokens each per variant, interleaved")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512, help="d = d_s; SwiGLU 2.6875 d rounded to 8, heads of 64")
    ap.add_argument("--plain", action="store_true", help="add StateLoop with its branch as plain closures (docstring)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = args.width
    shape = {**SHAPE, "n_layers": args.layers, "d_model": d, "d_ff": 8 * round(2.6875 * d / 8), "n_heads": d // 64, "mixer_heads": d // 64}
    vanilla = ModelConfig(name="vanilla_looped", K=4, d_s=0, **shape)
    models, clocks = {}, {}
    variants = VARIANTS + (("stateloop:plain",) if args.plain else ())
    for name in variants:
        torch.manual_seed(VARIANTS.index(name.split(":")[0]))
        models[name] = accelerate(build_model(ModelConfig(name=name.split(":")[0], K=4, d_s=d, **shape)).eval())
        if name.endswith(":plain"):
            plain_stateloop(models[name])
            with torch.inference_mode():
                idx = torch.randint(0, shape["vocab_size"], (1, 8))
                same = torch.equal(models[name](idx).logits, models["stateloop"](idx).logits)
            assert same, "the plain closures changed StateLoop's logits"
        clocks[name] = [instrument(models[name])]
    torch.manual_seed(len(VARIANTS))
    models["vanilla"] = accelerate(build_model(vanilla).eval())
    clocks["vanilla"] = [instrument_backbone(models["vanilla"], piece) for piece in BACKBONE_PIECES]

    def branch_flops(name):  # context -> (F of the branch, F of the rest of the token)
        return lambda ctx: (
            decode_flops_per_token(models[name].cfg, ctx) - decode_flops_per_token(vanilla, ctx),
            decode_flops_per_token(vanilla, ctx),
        )

    def piece_flops(piece):
        def flops(ctx):
            f = backbone_piece_flops(vanilla, piece, ctx)
            return f, decode_flops_per_token(vanilla, ctx) - f

        return flops

    # rows: name -> (model, which of its clocks, FLOPs of the timed part and of the rest)
    rows = {name: (name, 0, branch_flops(name)) for name in variants}
    rows.update({f"vanilla:{piece}": ("vanilla", i, piece_flops(piece)) for i, piece in enumerate(BACKBONE_PIECES)})
    for name, m in models.items():  # warm-up
        decode_shares(m, clocks[name], args.prefill, 2)
    ratios, token_ms, branch_pct = ({row: [] for row in rows} for _ in range(3))
    for _ in range(args.rounds):
        for name, m in models.items():
            for ctx, total, spent in decode_shares(m, clocks[name], args.prefill, args.tokens):
                for row, (model_name, i, flops) in rows.items():
                    if model_name != name:
                        continue
                    f_part, f_rest = flops(ctx)
                    ratios[row].append((spent[i] / (total - spent[i])) / (f_part / f_rest))
                    token_ms[row].append(1e3 * total)
                    branch_pct[row].append(100 * spent[i] / (total - spent[i]))
    print(
        f"torch {torch.__version__}, 1 thread, fp32, batch 1; {args.layers} layers, d = d_s = {d}, K = 4; "
        f"{args.rounds} rounds of {args.tokens} tokens after {args.prefill}, each model alone; per-token quartiles"
    )
    print(f"{'model':<18}{'ms/token':>10}{'branch / rest':>15}{'floor':>8}{'x floor (q1, median, q3)':>28}")
    ctx = args.prefill + (args.tokens - 1) / 2
    for row, (_, _, flops) in rows.items():
        f_part, f_rest = flops(ctx)
        q1, med, q3 = quartiles(ratios[row])
        print(
            f"{row:<18}{statistics.median(token_ms[row]):>10.2f}{statistics.median(branch_pct[row]):>14.2f}%"
            f"{100 * f_part / f_rest:>7.2f}%{q1:>12.2f}{med:>8.2f}{q3:>8.2f}"
        )
    print(
        "branch / rest: the state branch's time over the rest of the token (median over tokens); floor: the same "
        "for FLOPs (models/flops.py); x floor: their ratio, per token. vanilla:<piece>: that sub-block of every "
        "backbone layer in Vanilla Looped's tokens, scored as if it were a branch"
    )


if __name__ == "__main__":
    main()
