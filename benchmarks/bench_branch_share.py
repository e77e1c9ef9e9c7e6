"""The state branch's share of each decoded token, timed inside the model (issue 24's decode aim).

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


def instrument(model) -> BranchClock:
    """Timers around the model's branch calls (once per model)."""
    clock = BranchClock()
    model.cell.forward = clock.wrap(model.cell.forward)  # instance attributes: nn.Module.__call__ finds them first
    model.mixer.forward = clock.wrap(model.mixer.forward)
    model.read = clock.wrap(model.read)
    return clock


def plain_stateloop(model) -> None:
    """Replace ``model``'s cell and reads by closures over its current tensors (fp32, decoding only,
    no read masks): the bound for a branch with no Python around its operators (module docstring)."""
    cell, d_s = model.cell, model.cfg.d_state
    with torch.no_grad():
        W, b, neg_lambda = (t.clone() for t in cell._fused())
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
def decode_shares(model, clock: BranchClock, prefill: int, tokens: int) -> list[tuple[int, float, float]]:
    """(context, token seconds, branch seconds) of each decoded token after a prefill."""
    cache = ModelCache()
    idx = torch.randint(0, model.cfg.vocab_size, (1, prefill))
    nxt = model(idx, cache=cache).logits[:, -1:].argmax(-1)
    out = []
    for i in range(tokens):
        clock.spent = 0.0
        t0 = time.perf_counter()
        nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
        out.append((prefill + i, time.perf_counter() - t0, clock.spent))
    return out


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4)
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
    models, clocks = {}, {}
    variants = VARIANTS + (("stateloop:plain",) if args.plain else ())
    for i, name in enumerate(variants):
        torch.manual_seed(VARIANTS.index(name.split(":")[0]))
        models[name] = build_model(ModelConfig(name=name.split(":")[0], K=4, d_state=d, **shape)).eval()
        if name.endswith(":plain"):
            plain_stateloop(models[name])
            with torch.inference_mode():
                idx = torch.randint(0, shape["vocab_size"], (1, 8))
                same = torch.equal(models[name](idx).logits, models["stateloop"](idx).logits)
            assert same, "the plain closures changed StateLoop's logits"
        clocks[name] = instrument(models[name])
    vanilla = ModelConfig(name="vanilla_looped", K=4, d_state=0, **shape)
    for name, m in models.items():  # warm-up
        decode_shares(m, clocks[name], args.prefill, 2)
    ratios = {name: [] for name in variants}
    token_ms, branch_pct = {name: [] for name in variants}, {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, m in models.items():
            for ctx, total, branch in decode_shares(m, clocks[name], args.prefill, args.tokens):
                f_rest = decode_flops_per_token(vanilla, ctx)
                f_branch = decode_flops_per_token(m.cfg, ctx) - f_rest
                ratios[name].append((branch / (total - branch)) / (f_branch / f_rest))
                token_ms[name].append(1e3 * total)
                branch_pct[name].append(100 * branch / (total - branch))
    print(
        f"torch {torch.__version__}, 1 thread, fp32, batch 1; {args.layers} layers, d = d_s = {d}, K = 4; "
        f"{args.rounds} rounds of {args.tokens} tokens after {args.prefill}, each variant alone; per-token quartiles"
    )
    print(f"{'model':<18}{'ms/token':>10}{'branch / rest':>15}{'floor':>8}{'x floor (q1, median, q3)':>28}")
    for name in variants:
        ctx = args.prefill + (args.tokens - 1) / 2
        floor = 100 * (decode_flops_per_token(models[name].cfg, ctx) / decode_flops_per_token(vanilla, ctx) - 1)
        q1, med, q3 = quartiles(ratios[name])
        print(
            f"{name:<18}{statistics.median(token_ms[name]):>10.2f}{statistics.median(branch_pct[name]):>14.2f}%"
            f"{floor:>7.2f}%{q1:>12.2f}{med:>8.2f}{q3:>8.2f}"
        )
    print(
        "branch / rest: the state branch's time over the rest of the token (median over tokens); floor: the same "
        "for FLOPs (models/flops.py); x floor: their ratio, per token"
    )


if __name__ == "__main__":
    main()
