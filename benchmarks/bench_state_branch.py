"""The StateLoop state branch's CPU cost against its FLOP share, side by side in one process.

One question, five measurements (subcommands); each times its variants interleaved or inside the
same token or step, so load on the machine hits both sides of a ratio alike. The score is

    x floor = (t_branch / t_rest) / (F_branch / F_rest)

the branch's time over its arithmetic share (models/flops.py), 1.00 meaning the branch costs per
FLOP what the rest of the model costs; F_rest is Vanilla Looped's. Models come from the registry
at d = d_s, SwiGLU 2.6875 d rounded to 8, heads of 64 (the mixers' too), K = 4, fp32.

- ``decode``: the branch's share of each decoded token, timed inside the token (timers around the
  cell, eqs. 2, 5, 6; the mixer, eqs. 7-9; the reads, eqs. 3, 4, 10) of the ``accelerate``d model.
  ``vanilla:attention`` and ``vanilla:swiglu`` score the backbone's sub-blocks (pre-norm included)
  the same way inside Vanilla Looped's tokens. ``--plain`` adds StateLoop with its cell and reads
  as closures over tensors taken once (how much of the branch is Python around its operators);
  ``--printed`` adds each variant in the paper's printed forms (not ``accelerate``d).
- ``train``: the same score inside each training step, forward (profiler ranges) and backward
  (the autograd nodes whose sequence numbers belong to operators inside those ranges). Left on the
  rest's side: the reads' residual adds and the weight gradients' accumulation over K.
- ``pieces``: each piece alone (a backbone layer, its attention and SwiGLU sub-blocks, the cell, a
  read, the attention and Mamba-2 mixers), forward + backward from a fixed random gradient: time
  per FLOP against the SwiGLU's, and each branch against its floor (time per FLOP over a layer's);
  then the inference forward of one token of each piece ``accelerate`` changes, fused against printed.
- ``cold``: each step of the fused cell and the SwiGLU's ``silu`` and product, inside decoded
  tokens and hot in a loop on the same tensors (the cost of being evicted between calls). The
  step-by-step copies are checked to give the modules' floats first.
- ``whole``: forward + backward of whole models against Vanilla Looped (the difference of two
  steps: too noisy for the branch at small sizes, kept for the parameter and step overheads).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_state_branch.py decode --plain [--layers 24 --width 128]
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_state_branch.py train|pieces|cold|whole [--help]
"""

from __future__ import annotations

import argparse
import bisect
import copy
import statistics
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from stateloop.config.model import ModelConfig
from stateloop.fast import accelerate
from stateloop.models.cache import ModelCache
from stateloop.models.flops import compute_profile, counter, decode_flops_per_token
from stateloop.models.fused import cell_weights
from stateloop.models.kernels import cast, rms_norm, upcast
from stateloop.models.registry import build_model, count_params

MODELS = ("vanilla_looped", "stateloop", "stateloop_attn", "stateloop_mamba2")
VARIANTS = MODELS[1:]
PAPER_PARAM_OVERHEAD = {"stateloop": 1.18, "stateloop_attn": 2.36, "stateloop_mamba2": 3.26}  # % at 1.4B
BACKBONE_PIECES = {"attention": ("attn_norm", "attn"), "swiglu": ("ffn_norm", "ffn")}
LABEL = "state branch"
PIECE_LABELS = {f"vanilla:{piece}": piece for piece in BACKBONE_PIECES}  # profiler range -> backbone sub-block
BACKWARD_NODE = "autograd::engine::evaluate_function: "


def config(name: str, vocab: int = 4096, layers: int = 8, d: int = 512, groups: int = 1) -> ModelConfig:
    """d = d_s, SwiGLU 2.6875 d rounded to 8, heads of 64 (the mixers' too), K = 4; Mamba-2 expand 2,
    state 128, conv 4, ``groups`` groups; the pure-PyTorch attention and scan."""
    return ModelConfig(
        name=name, vocab_size=vocab, n_layers=layers, d_model=d, d_ff=8 * round(2.6875 * d / 8), n_heads=d // 64,
        head_dim=64, K=4, d_s=0 if name == "vanilla_looped" else d, max_seq_len=2048, mixer_heads=d // 64,
        mixer_head_dim=64, mamba_expand=2, mamba_d_state=128, mamba_d_conv=4, mamba_head_dim=64, mamba_n_groups=groups,
        attn_impl="torch", ssd_impl="torch",
    )


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3); one value is all three."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else (xs[0],) * 3
    return q[0], statistics.median(xs), q[2]


# -- which calls are the branch ------------------------------------------------------------------
def wrap_branch(model, wrap) -> None:
    """The model's state-branch calls (cell, mixer, reads) replaced by ``wrap`` of each (instance
    attributes: ``nn.Module.__call__`` finds them first)."""
    model.cell.forward = wrap(model.cell.forward)
    model.mixer.forward = wrap(model.mixer.forward)
    model.read = wrap(model.read)


def wrap_backbone_piece(model, piece: str, wrap) -> None:
    """One sub-block of every backbone layer, its pre-norm and its attention or SwiGLU, replaced by
    ``wrap`` of each call (the residual add stays outside, as the reads' adds do)."""
    for layer in model.backbone.layers:
        for part in BACKBONE_PIECES[piece]:
            module = getattr(layer, part)
            module.forward = wrap(module.forward)


# -- decode ---------------------------------------------------------------------------------------
class Clock:
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


def decode_piece_flops(cfg, piece: str, context: float) -> float:
    """FLOPs of one backbone sub-block per decoded token, all K applications of all layers: q, k, v,
    o and QK^T, AV over context + 1 keys; or SwiGLU's three products (with the head's 2 d V, the
    whole of ``decode_flops_per_token``: tests/test_benchmarks.py)."""
    d, inner = cfg.d_model, cfg.n_heads * cfg.head_dim
    per_layer = 2 * 4 * d * inner + 4 * (context + 1) * inner if piece == "attention" else 2 * 3 * d * cfg.d_ff
    return cfg.K * cfg.n_layers * per_layer


def plain_stateloop(model) -> None:
    """``model``'s cell and reads as closures over its current tensors (fp32, decoding only, no
    read masks): the same operators as the fused forms with no Python around them."""
    cell, d_s = model.cell, model.cfg.d_s
    with torch.no_grad():
        W, b, neg_lambda = (t.clone() for t in cell_weights(cell))
    g_h, g_s, eps = cell.norm_h.weight.detach(), model.norm_s.weight.detach(), cell.norm_h.eps
    d = g_h.numel()
    linear, norm, softplus, exp, lerp, addcmul = F.linear, torch.rms_norm, F.softplus, torch.exp, torch.lerp, torch.addcmul

    def cell_forward(S, H):
        P, pre = linear(norm(H, (d,), g_h, eps), W, b).chunk(2, -1)  # (2), (5)
        g = exp(softplus(pre) * neg_lambda)  # (6)
        return addcmul(P, g, P, value=-1.0) if S is None else lerp(P, S, g)

    weights = {id(model.W_sz): model.W_sz.weight.detach(), id(model.W_sout): model.W_sout.weight.detach()}

    def read(Wm, S, keep=None):
        return linear(norm(S, (d_s,), g_s, eps), weights[id(Wm)])  # (3), (4), (10)

    cell.forward, model.read = cell_forward, read


@torch.inference_mode()
def decode_shares(model, clocks: list[Clock], prefill: int, tokens: int) -> list[tuple[int, float, list[float]]]:
    """(context, token seconds, seconds in each clock's calls) of each decoded token after a prefill."""
    cache = ModelCache()
    nxt = model(torch.randint(0, model.cfg.vocab_size, (1, prefill)), cache=cache).logits[:, -1:].argmax(-1)
    out = []
    for i in range(tokens):
        for clock in clocks:
            clock.spent = 0.0
        t0 = time.perf_counter()
        nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
        out.append((prefill + i, time.perf_counter() - t0, [clock.spent for clock in clocks]))
    return out


def run_decode(args) -> None:
    vanilla = config("vanilla_looped", 4096, args.layers, args.width)
    names = [*VARIANTS, *(("stateloop:plain",) if args.plain else ()), *(f"{v}:printed" for v in VARIANTS if args.printed)]
    models, clocks = {}, {}
    for name in names:
        base = name.split(":")[0]
        torch.manual_seed(VARIANTS.index(base))  # a variant's printed and plain rows share its weights
        model = build_model(config(base, 4096, args.layers, args.width)).eval()
        models[name] = model if name.endswith(":printed") else accelerate(model)
        if name.endswith(":plain"):
            plain_stateloop(model)
            with torch.inference_mode():
                idx = torch.randint(0, 4096, (1, 8))
                assert torch.equal(model(idx).logits, models["stateloop"](idx).logits), "the closures changed the logits"
        clocks[name] = [Clock()]
        wrap_branch(model, clocks[name][0].wrap)
    torch.manual_seed(len(VARIANTS))
    models["vanilla"] = accelerate(build_model(vanilla).eval())
    clocks["vanilla"] = [Clock() for _ in BACKBONE_PIECES]
    for clock, piece in zip(clocks["vanilla"], BACKBONE_PIECES):
        wrap_backbone_piece(models["vanilla"], piece, clock.wrap)

    def branch_flops(name):  # context -> (F of the timed part, F of the rest of the token)
        cfg = models[name].cfg
        return lambda ctx: (decode_flops_per_token(cfg, ctx) - decode_flops_per_token(vanilla, ctx),
                            decode_flops_per_token(vanilla, ctx))

    def piece_flops(piece):
        return lambda ctx: (decode_piece_flops(vanilla, piece, ctx),
                            decode_flops_per_token(vanilla, ctx) - decode_piece_flops(vanilla, piece, ctx))

    rows = {name: (name, 0, branch_flops(name)) for name in names}  # row -> (model, its clock, FLOPs)
    rows.update({f"vanilla:{piece}": ("vanilla", i, piece_flops(piece)) for i, piece in enumerate(BACKBONE_PIECES)})
    for name, m in models.items():  # warm-up
        decode_shares(m, clocks[name], args.prefill, 2)
    ratios, token_ms, share = ({row: [] for row in rows} for _ in range(3))
    for _ in range(args.rounds):
        for name, m in models.items():
            for ctx, total, spent in decode_shares(m, clocks[name], args.prefill, args.tokens):
                for row, (model_name, i, flops) in rows.items():
                    if model_name == name:
                        f_part, f_rest = flops(ctx)
                        ratios[row].append((spent[i] / (total - spent[i])) / (f_part / f_rest))
                        token_ms[row].append(1e3 * total)
                        share[row].append(100 * spent[i] / (total - spent[i]))
    print(f"torch {torch.__version__}, 1 thread, fp32, batch 1; {args.layers} layers, d = d_s = {args.width}, K = 4; "
          f"{args.rounds} rounds of {args.tokens} tokens after {args.prefill}, each model alone; per-token quartiles")
    print(f"{'model':<26}{'ms/token':>10}{'branch / rest':>15}{'floor':>8}{'x floor (q1, median, q3)':>28}")
    ctx = args.prefill + (args.tokens - 1) / 2
    for row, (_, _, flops) in rows.items():
        f_part, f_rest = flops(ctx)
        q1, med, q3 = quartiles(ratios[row])
        print(f"{row:<26}{statistics.median(token_ms[row]):>10.2f}{statistics.median(share[row]):>14.2f}%"
              f"{100 * f_part / f_rest:>7.2f}%{q1:>12.2f}{med:>8.2f}{q3:>8.2f}")
    print("branch / rest: the branch's time over the rest of the token (median); floor: the same for FLOPs; x floor: "
          "their ratio, per token. vanilla:<piece>: that sub-block of every layer in Vanilla Looped's tokens")


# -- train ----------------------------------------------------------------------------------------
def labelled(fn, label: str = LABEL):
    """``fn`` run inside a profiler range named ``label``."""

    def wrapped(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapped


def train_piece_flops(model, piece: str, batch: int, seq: int) -> float:
    """Training FLOPs per token of one backbone sub-block (``vanilla:attention`` or ``vanilla:swiglu``)
    in all K applications of all layers, counted on a copy of the first layer's forward and backward."""
    layer = copy.deepcopy(model.backbone.layers[0])  # the model's own is wrapped in profiler ranges
    idx = torch.randint(0, model.cfg.vocab_size, (batch, seq))
    rope = model.inputs(idx, None)[1]
    x = torch.randn(batch, seq, model.cfg.d_model, requires_grad=True)
    with counter() as c:
        out = layer.attn(layer.attn_norm(x), rope) if piece == "vanilla:attention" else layer.ffn(layer.ffn_norm(x))
        out.backward(torch.randn_like(out))
    return c.get_total_flops() / (batch * seq) * model.cfg.K * len(model.backbone.layers)


def labelled_times(events, label: str = LABEL) -> tuple[float, float, list[str]]:
    """(forward seconds, backward seconds, names of the backward nodes counted) of the work inside
    the profiler ranges named ``label``, from one profiled forward and backward. Forward: the
    ranges' durations. Backward: the autograd nodes whose sequence numbers are those of operators
    that ran inside the ranges. Ranges of one label must not nest."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == label)
    starts = [s for s, _ in spans]

    def inside(e) -> bool:
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        return i >= 0 and e.time_range.end <= spans[i][1]

    seqs = {e.sequence_nr for e in events
            if e.sequence_nr >= 0 and e.name != label and not e.name.startswith("autograd::") and inside(e)}
    nodes = [e for e in events if e.name.startswith(BACKWARD_NODE) and e.sequence_nr in seqs]
    forward = sum(end - start for start, end in spans) / 1e6
    backward = sum(e.cpu_time_total for e in nodes) / 1e6
    return forward, backward, [e.name[len(BACKWARD_NODE):] for e in nodes]


def profiled_step(model, idx, labels=(LABEL,)) -> tuple[float, ...]:
    """(step seconds, then forward and backward seconds of each label's ranges) of one training step."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(idx).logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        step = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    events = prof.events()
    return (step, *(t for label in labels for t in labelled_times(events, label)[:2]))


def run_train(args) -> None:
    cfgs = {name: config(name, args.vocab, args.layers, args.width, args.groups) for name in MODELS}
    models, labels = {}, {}
    for name in MODELS:
        torch.manual_seed(0)
        models[name] = build_model(cfgs[name])
        if name == "vanilla_looped":
            piece_flops = {piece: train_piece_flops(models[name], piece, args.batch, args.seq) for piece in PIECE_LABELS}
            for label, piece in PIECE_LABELS.items():
                wrap_backbone_piece(models[name], piece, lambda fn, label=label: labelled(fn, label))
            labels[name] = tuple(PIECE_LABELS)
        else:
            wrap_branch(models[name], labelled)
            labels[name] = (LABEL,)
    flops = {name: compute_profile(cfgs[name], args.seq).flops_per_token for name in MODELS}  # forward + backward
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    for name, m in models.items():  # warm-up
        profiled_step(m, idx, labels[name])
    steps = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name, m in models.items():
            steps[name].append(profiled_step(m, idx, labels[name]))
    vanilla = statistics.median(row[0] for row in steps["vanilla_looped"])
    print(f"torch {torch.__version__}, 1 thread, fp32, batch {args.batch} x {args.seq} tokens; {args.layers} layers, "
          f"d = d_s = {args.width}, K = 4; {args.rounds} profiled steps of each model, interleaved; "
          f"Vanilla Looped {vanilla * 1e3:.1f} ms a step")
    print(f"{'model':<18}{'ms/step':>9}{'fwd ms':>8}{'bwd ms':>8}{'rest / Vanilla':>16}{'branch / rest':>15}{'floor':>8}"
          f"{'x floor (q1, median, q3)':>28}")
    # row -> ((step, forward, backward) per step, FLOP share floor, whether "rest / Vanilla" applies)
    table = {name: (steps[name], flops[name] / flops["vanilla_looped"] - 1, True) for name in VARIANTS}
    for i, piece in enumerate(PIECE_LABELS):  # each scored as if it were a branch added to the rest of the step
        timed = [(row[0], row[1 + 2 * i], row[2 + 2 * i]) for row in steps["vanilla_looped"]]
        table[piece] = (timed, piece_flops[piece] / (flops["vanilla_looped"] - piece_flops[piece]), False)
    for name, (rows, floor, versus_vanilla) in table.items():
        shares = [(f + b) / (s - f - b) for s, f, b in rows]
        q = quartiles([share / floor for share in shares])
        step, fwd, bwd = (statistics.median(col) for col in zip(*rows))
        rest = f"{statistics.median(s - f - b for s, f, b in rows) / vanilla:.3f}" if versus_vanilla else ""
        print(f"{name:<18}{step * 1e3:>9.1f}{fwd * 1e3:>8.1f}{bwd * 1e3:>8.1f}{rest:>16}"
              f"{100 * statistics.median(shares):>14.2f}%{100 * floor:>7.2f}%{q[0]:>12.2f}{q[1]:>8.2f}{q[2]:>8.2f}")
    print("fwd, bwd: the branch's forward and backward inside the step; rest / Vanilla: the step less the branch over "
          "Vanilla Looped's (about 1 when nothing is missed); floor: the branch's training FLOPs over Vanilla's; x floor: "
          "branch / rest over floor, per step; vanilla:<piece>: that sub-block of every layer in Vanilla Looped's steps")


# -- pieces ---------------------------------------------------------------------------------------
# Each variant's state branch in one iteration, as rows of the pieces table.
BRANCHES = {"stateloop": ("StateLoop cell", "read"), "stateloop_attn": ("StateLoop cell", "attention mixer", "read"),
            "stateloop_mamba2": ("StateLoop cell", "Mamba-2 mixer", "read")}


def pieces(attn_model, mamba_model, H) -> dict:
    """name -> (module, function of (module, x, rope) -> output), the modules of registry-built models."""
    layer = mamba_model.backbone.layers[0]
    return {
        "backbone layer": (layer, lambda m, x, r: m(x, r)),
        "backbone attention": (layer, lambda m, x, r: x + m.attn(m.attn_norm(x), r)),
        "backbone SwiGLU": (layer, lambda m, x, r: x + m.ffn(m.ffn_norm(x))),
        "StateLoop cell": (mamba_model.cell, lambda m, x, r: m(x, H.expand_as(x))),
        "read": (mamba_model, lambda m, x, r: H + m.read(m.W_sz, x)),
        "attention mixer": (attn_model.mixer, lambda m, x, r: m(x, r)),
        "Mamba-2 mixer": (mamba_model.mixer, lambda m, x, r: m(x, r)),
    }


def fwd_bwd(module, fn, x, rope, grad) -> None:
    fn(module, x, rope).backward(grad)
    module.zero_grad(set_to_none=True)
    x.grad = None


def interleaved(fns: dict, rounds: int, inner: int) -> dict[str, list[float]]:
    """Seconds per call of each function in each round, timed in alternating blocks of ``inner`` calls."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times[k].append((time.perf_counter() - t0) / inner)
    return times


def run_pieces(args) -> None:
    torch.manual_seed(0)
    attn_model, mamba_model = (build_model(config(name, 4096, 1, args.width)) for name in ("stateloop_attn", "stateloop_mamba2"))
    H = torch.randn(1, 1, args.width)  # broadcast over the tokens: the cell reads H^k per token
    x = torch.randn(1, args.seq, args.width, requires_grad=True)
    rope = mamba_model.inputs(torch.zeros(1, args.seq, dtype=torch.long), None)[1]
    todo = pieces(attn_model, mamba_model, H)
    flops, grads = {}, {}
    for name, (m, fn) in todo.items():
        grads[name] = torch.randn(fn(m, x, rope).shape)
        with counter() as c:
            fwd_bwd(m, fn, x, rope, grads[name])
        flops[name] = c.get_total_flops()
        fwd_bwd(m, fn, x, rope, grads[name])  # warm-up
    times = interleaved({name: lambda m=m, fn=fn, name=name: fwd_bwd(m, fn, x, rope, grads[name])
                         for name, (m, fn) in todo.items()}, args.rounds, args.inner)
    t = {name: statistics.median(v) for name, v in times.items()}
    ref = t["backbone SwiGLU"] / flops["backbone SwiGLU"]
    print(f"torch {torch.__version__}, 1 thread, batch 1 x {args.seq} tokens, fp32, d = d_s = {args.width}; "
          f"forward + backward, median of {args.rounds} interleaved rounds of {args.inner}")
    print(f"{'piece':<20}{'ms':>9}{'MFLOP':>10}{'GFLOP/s':>9}{'time/FLOP vs SwiGLU':>21}")
    for name in todo:
        print(f"{name:<20}{t[name] * 1e3:>9.2f}{flops[name] / 1e6:>10.1f}{flops[name] / t[name] / 1e9:>9.1f}"
              f"{t[name] / flops[name] / ref:>21.2f}")
    layer = t["backbone layer"] / flops["backbone layer"]
    print("\nthe state branch of one iteration against its floor (time per FLOP over a backbone layer's; quartiles "
          "over the rounds):")
    for variant, parts in BRANCHES.items():
        bt, bf = sum(t[p] for p in parts), sum(flops[p] for p in parts)
        per_round = [sum(times[p][i] for p in parts) / bf / (times["backbone layer"][i] / flops["backbone layer"])
                     for i in range(args.rounds)]
        q1, _, q3 = quartiles(per_round)
        print(f"{variant:<20}{bt * 1e3:>9.2f}{bf / 1e6:>10.1f}{bf / bt / 1e9:>9.1f}{'x floor':>12}{bt / bf / layer:>9.2f}"
              f"  ({q1:.2f}, {q3:.2f})")

    # Inference, one token (batch 1, T = 1): the pieces accelerate() changes, fused against printed.
    fast = {name: accelerate(copy.deepcopy(m)) for name, m in (("attn", attn_model), ("mamba", mamba_model))}
    one = torch.randn(1, 1, args.width)
    rope1 = mamba_model.inputs(torch.zeros(1, 1, dtype=torch.long), None)[1]
    calls = {
        "backbone attention": lambda m: m.backbone.layers[0].attn(m.backbone.layers[0].attn_norm(one), rope1),
        "StateLoop cell": lambda m: m.cell(one, H),
        "attention mixer": lambda m: m.mixer(one, rope1),
    }
    owner = {"backbone attention": "mamba", "StateLoop cell": "mamba", "attention mixer": "attn"}
    printed = {"attn": attn_model, "mamba": mamba_model}
    fns = {}
    with torch.inference_mode():
        for name, call in calls.items():
            a, b = call(printed[owner[name]]), call(fast[owner[name]])
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)  # the dtype's rounding, not bit for bit
            fns[f"{name}, printed"] = lambda call=call, name=name: call(printed[owner[name]])
            fns[f"{name}, fused"] = lambda call=call, name=name: call(fast[owner[name]])
        inf = interleaved(fns, args.rounds, 20 * args.inner)
    print(f"\ninference forward of one token, median of {args.rounds} interleaved rounds of {20 * args.inner}:")
    print(f"{'piece':<20}{'printed us':>12}{'fused us':>10}{'fused / printed':>17}")
    for name in calls:
        p, f = statistics.median(inf[f"{name}, printed"]), statistics.median(inf[f"{name}, fused"])
        print(f"{name:<20}{p * 1e6:>12.1f}{f * 1e6:>10.1f}{f / p:>17.2f}")


# -- cold -----------------------------------------------------------------------------------------
COLD_PIECES = ("cell RMSNorm", "cell product", "cell chunk", "softplus", "mul, exp", "lerp", "SwiGLU silu, mul")


def cell_steps(cell, weights, S, H, spent: dict | None):
    """The cell's fused inference form (models/fused.py, S^k given) one operator at a time on
    ``weights`` = fused.cell_weights(cell); each step's seconds appended to ``spent[piece]`` when
    given. Returns S~^{k+1} and the steps' inputs (for the hot loop)."""
    W, b, neg_lambda = weights
    t = [time.perf_counter()]
    U = rms_norm(H, cell.norm_h.weight, cell.norm_h.eps)
    t.append(time.perf_counter())
    y = upcast(F.linear(U, W, b))
    t.append(time.perf_counter())
    P, pre = y.chunk(2, dim=-1)
    t.append(time.perf_counter())
    sp = F.softplus(pre)
    t.append(time.perf_counter())
    g = torch.exp(sp * neg_lambda)
    t.append(time.perf_counter())
    out = torch.lerp(P, cast(S, P.dtype), g)
    t.append(time.perf_counter())
    if spent is not None:
        for piece, t0, t1 in zip(COLD_PIECES, t, t[1:]):
            spent[piece].append(t1 - t0)
    return out, dict(H=H, U=U, W=W, b=b, y=y, pre=pre, sp=sp, neg_lambda=neg_lambda, P=P, S=S, g=g)


def hot_calls(cell, x: dict, a, b_, n: int) -> dict[str, float]:
    """Seconds per call of each piece repeated ``n`` times on the same tensors."""
    calls = {
        "cell RMSNorm": lambda: rms_norm(x["H"], cell.norm_h.weight, cell.norm_h.eps),
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


def run_cold(args) -> None:
    torch.manual_seed(0)
    model = accelerate(build_model(config("stateloop", 4096, args.layers, args.width)).eval())
    cell, d = model.cell, args.width
    spent, last = defaultdict(list), {}
    with torch.inference_mode():
        weights = cell_weights(cell)
        H, S = torch.randn(1, 3, d), torch.randn(1, 3, d)
        assert torch.equal(cell_steps(cell, weights, S, H, None)[0], cell(S, H)), "the timed cell differs from the module"
    module_cell_forward = cell.forward

    def timed_cell(S, H):
        if S is None:  # S^0 = 0: the module's own path (one operator fewer), not timed
            return module_cell_forward(S, H)
        out, last["cell"] = cell_steps(cell, weights, S, H, spent)
        return out

    def timed_swiglu(ffn):
        def forward(h):
            a, b_ = ffn.w_gate(h), ffn.w_up(h)
            t0 = time.perf_counter()
            y = F.silu(a) * b_
            spent["SwiGLU silu, mul"].append(time.perf_counter() - t0)
            last["ffn"] = (a, b_)
            return ffn.w_down(y)

        return forward

    with torch.inference_mode():
        x = torch.randn(1, 3, d)
        ffn = model.backbone.layers[0].ffn
        reference = ffn(x)
        for layer in model.backbone.layers:
            layer.ffn.forward = timed_swiglu(layer.ffn)
        assert torch.equal(ffn(x), reference), "the timed SwiGLU differs from the module"
        cell.forward = timed_cell
        cache = ModelCache()
        nxt = model(torch.randint(0, 4096, (1, args.prefill)), cache=cache).logits[:, -1:].argmax(-1)
        spent.clear()
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            nxt = model(nxt, cache=cache).logits[:, -1:].argmax(-1)
        token = (time.perf_counter() - t0) / args.tokens
        hot = hot_calls(cell, last["cell"], *last["ffn"], args.hot)
    print(f"torch {torch.__version__}, 1 thread, fp32, batch 1; StateLoop, {args.layers} layers, d = d_s = {d}, K = 4; "
          f"{args.tokens} tokens after {args.prefill}: {1e3 * token:.2f} ms a token")
    print(f"{'piece':<28}{'in a token (us, median)':>25}{'hot (us)':>10}{'ratio':>8}")
    for piece in COLD_PIECES:
        cold = statistics.median(spent[piece])
        print(f"{piece:<28}{1e6 * cold:>25.1f}{1e6 * hot[piece]:>10.1f}{cold / hot[piece]:>8.2f}")
    print("in a token: each call inside the decoded tokens (the cell from its second iteration on); hot: the same "
          "call repeated on the same tensors")


# -- whole ----------------------------------------------------------------------------------------
def step_time(model, idx) -> float:
    t0 = time.perf_counter()
    F.cross_entropy(model(idx).logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def run_whole(args) -> None:
    torch.manual_seed(0)
    cfgs = {name: config(name, args.vocab, args.layers, args.width, args.groups) for name in MODELS}
    models = {name: build_model(cfg) for name, cfg in cfgs.items()}
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    for m in models.values():  # warm-up
        step_time(m, idx)
    times = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name, m in models.items():
            times[name].append(step_time(m, idx))
    base_t, base_p = statistics.median(times["vanilla_looped"]), count_params(cfgs["vanilla_looped"])
    flops = {name: compute_profile(cfg, args.seq).flops_per_token for name, cfg in cfgs.items()}  # forward + backward
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq} tokens, "
          f"{args.rounds} interleaved rounds (median); {args.layers} layers, d = d_s = {args.width}, "
          f"Mamba-2 {args.groups} group(s)")
    print(f"{'model':<18}{'ms/step':>10}{'time ratio':>12}{'FLOP ratio':>12}{'x floor':>9}{'(q1, q3)':>14}{'params':>12}"
          f"{'param +%':>10}{'paper +% (1.4B)':>17}")
    for name in MODELS:
        t, p, paper = statistics.median(times[name]), count_params(cfgs[name]), PAPER_PARAM_OVERHEAD.get(name)
        floor = flops[name] / flops["vanilla_looped"]
        times_floor = spread = ""
        if floor > 1:
            times_floor = f"{(t / base_t - 1) / (floor - 1):.2f}"
            if args.rounds >= 4:  # the same ratio in each round, vanilla timed beside it
                q = statistics.quantiles([(a / b - 1) / (floor - 1) for a, b in zip(times[name], times["vanilla_looped"])], n=4)
                spread = f"({q[0]:.2f}, {q[2]:.2f})"
        print(f"{name:<18}{t * 1e3:>10.1f}{t / base_t:>12.3f}{floor:>12.3f}{times_floor:>9}{spread:>14}{p:>12,}"
              f"{100 * (p / base_p - 1):>10.2f}{'' if paper is None else f'{paper:+.2f}':>17}")
    print("FLOP ratio: training FLOPs per token against vanilla_looped; x floor: (time ratio - 1) / (FLOP ratio - 1) "
          "from the medians; (q1, q3): its quartiles over the rounds")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="measure", required=True)

    def shape(p, layers=8, width=512):
        p.add_argument("--layers", type=int, default=layers)
        p.add_argument("--width", type=int, default=width, help="d = d_s")

    p = sub.add_parser("decode", help="the branch's share of each decoded token")
    shape(p)
    p.add_argument("--prefill", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="decodes of --tokens each per model, interleaved")
    p.add_argument("--plain", action="store_true", help="add StateLoop with its cell and reads as plain closures")
    p.add_argument("--printed", action="store_true", help="add each variant in the printed forms (not accelerated)")
    p.set_defaults(run=run_decode)
    for name, help_, run, batch, seq, rounds, vocab, layers, width in (
        ("train", "the branch's share of each training step, forward and backward", run_train, 1, 128, 5, 4096, 8, 512),
        ("whole", "whole models' forward + backward against Vanilla Looped", run_whole, 4, 256, 5, 50432, 24, 128),
    ):
        p = sub.add_parser(name, help=help_)
        shape(p, layers, width)
        p.add_argument("--batch", type=int, default=batch)
        p.add_argument("--seq", type=int, default=seq)
        p.add_argument("--rounds", type=int, default=rounds, help="steps of each model, interleaved")
        p.add_argument("--vocab", type=int, default=vocab)
        p.add_argument("--groups", type=int, default=1, help="Mamba-2 groups of heads (1.4B: 8)")
        p.set_defaults(run=run)
    p = sub.add_parser("pieces", help="each piece alone: fwd + bwd per FLOP; one token fused against printed")
    p.add_argument("--width", type=int, default=512, help="d = d_s")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--inner", type=int, default=5, help="calls per timed block")
    p.set_defaults(run=run_pieces)
    p = sub.add_parser("cold", help="the cell's and SwiGLU's operators inside decoded tokens and hot")
    shape(p)
    p.add_argument("--prefill", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--hot", type=int, default=200, help="calls of each piece in the hot loop")
    p.set_defaults(run=run_cold)
    args = ap.parse_args(argv)
    if args.measure != "whole":  # whole keeps torch's pool unless OMP_NUM_THREADS says otherwise
        torch.set_num_threads(1)
    args.run(args)


if __name__ == "__main__":
    main()
