"""The state branch's share of each training step, timed inside the step.

``bench_forward_backward.py`` takes the branch as the difference of two models' steps: at d = 512,
8 layers a step takes about 0.9 s on one thread and StateLoop's branch about 3% of it, so one
round's noise moves its x floor by 0.5 or more. ``bench_pieces.py`` times the branch's pieces on
their own, outside a model. Here the branch is timed inside the real training step, forward and
backward, with the step around it:

- forward: the branch's calls (the cell, eqs. 2, 5, 6; the mixer, eqs. 7-9; the reads, eqs. 3, 4,
  10) run inside ``record_function`` ranges, and torch's profiler gives each range's time;
- backward: each autograd node carries the sequence number of the forward operator that made it,
  so the backward nodes whose numbers belong to operators inside those ranges are the branch's
  backward, timed by the profiler as the engine evaluates them.

Per step, x floor = (t_branch / t_rest) / (F_branch / F_rest), t_rest the step less the branch and
F the training FLOPs per token (models/flops.py), F_rest Vanilla Looped's: the branch's time over
its arithmetic share, as in the other scripts. Left on the rest's side: the residual adds H + R of
the reads (two elementwise adds per iteration) and the accumulation of the branch's weight
gradients over the K iterations (autograd's AccumulateGrad nodes carry no sequence number). As a
check that nothing else is missed, Vanilla Looped is timed in the same rounds: each variant's
rest should take about its step.

The same score is given to the backbone's own sub-blocks inside Vanilla Looped's steps, as
``bench_branch_share.py`` does for decoding: ``vanilla:attention`` (each layer's pre-norm and
attention) and ``vanilla:swiglu`` (its pre-norm and SwiGLU), each scored as if it were a branch
added to the rest of the step, their FLOPs counted on one layer's sub-block (models/flops.py's
counter). They are the like-for-like reference: the attention mixer is the backbone's attention
class applied to the state.

The profiler costs a few microseconds per operator; at this shape an operator takes tens of
microseconds to milliseconds, so its cost is well under 1% of a step (Vanilla's step read the
same with and without it here).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_train_share.py [--layers 8 --width 512] [--seq 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_branch_share import BACKBONE_PIECES, quartiles, wrap_backbone_piece, wrap_branch  # noqa: E402  (the same calls timed)
from bench_forward_backward import MODELS, config  # noqa: E402  (the same model shape)

from stateloop.models.backbone import Rotary  # noqa: E402
from stateloop.models.flops import compute_profile, counter  # noqa: E402
from stateloop.models.registry import build_model  # noqa: E402

LABEL = "state branch"
PIECE_LABELS = {f"vanilla:{piece}": piece for piece in BACKBONE_PIECES}  # profiler range -> backbone sub-block
BACKWARD_NODE = "autograd::engine::evaluate_function: "


def labelled(fn, label: str = LABEL):
    """``fn`` run inside a profiler range named ``label``."""

    def wrapped(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapped


def instrument(model) -> None:
    """The model's branch calls (bench_branch_share.py's) in ranges named :data:`LABEL`."""
    wrap_branch(model, labelled)


def instrument_backbone(model) -> None:
    """Each layer's sub-blocks (bench_branch_share.py's) in ranges named by :data:`PIECE_LABELS`."""
    for label, piece in PIECE_LABELS.items():
        wrap_backbone_piece(model, piece, lambda fn, label=label: labelled(fn, label))


def backbone_piece_flops(model, piece: str, batch: int, seq: int) -> float:
    """Training FLOPs per token of one backbone sub-block in all K applications of all layers,
    counted on the first layer's forward and backward."""
    layer, cfg = model.backbone.layers[0], model.cfg
    rope = Rotary(seq, 0, cfg.head_dim, cfg.rope_theta, "cpu", torch.float32)
    x = torch.randn(batch, seq, cfg.d_model, requires_grad=True)
    norm, block = (getattr(layer, part) for part in BACKBONE_PIECES[PIECE_LABELS[piece]])
    with counter() as c:
        out = block(norm(x), rope) if piece == "vanilla:attention" else block(norm(x))
        out.backward(torch.randn_like(out))
    layer.zero_grad(set_to_none=True)
    return c.get_total_flops() / (batch * seq) * cfg.K * len(model.backbone.layers)


def labelled_times(events, label: str = LABEL) -> tuple[float, float, list[str]]:
    """(forward seconds, backward seconds, names of the backward nodes counted) of the work done
    inside the profiler ranges named ``label``, from one profiled forward and backward.

    Forward: the ranges' own durations. Backward: the autograd nodes whose sequence numbers are
    those of operators that ran inside the ranges (each node is timed once, with the operators it
    runs). Ranges of one label must not nest."""
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
        logits = model(idx).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        loss.backward()
        step = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    events = prof.events()
    return (step, *(t for label in labels for t in labelled_times(events, label)[:2]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5, help="profiled steps of each model, interleaved")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512, help="d = d_s")
    ap.add_argument("--groups", type=int, default=1, help="Mamba-2 groups of heads")
    args = ap.parse_args()
    torch.set_num_threads(1)

    def cfg(name):
        return config(name, args.vocab, args.layers, args.width, args.groups)

    models, labels = {}, {}
    for name in MODELS:
        torch.manual_seed(0)
        models[name] = build_model(cfg(name))
        if name == "vanilla_looped":
            instrument_backbone(models[name])
            labels[name] = tuple(PIECE_LABELS)
        else:
            instrument(models[name])
            labels[name] = (LABEL,)
    flops = {name: compute_profile(cfg(name), args.seq).flops_per_token for name in MODELS}  # forward + backward
    piece_flops = {piece: backbone_piece_flops(models["vanilla_looped"], piece, args.batch, args.seq)
                   for piece in PIECE_LABELS}
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    for name, m in models.items():  # warm-up
        profiled_step(m, idx, labels[name])
    steps = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name, m in models.items():
            steps[name].append(profiled_step(m, idx, labels[name]))
    vanilla = statistics.median(row[0] for row in steps["vanilla_looped"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, fp32, batch {args.batch} x {args.seq} tokens; "
          f"{args.layers} layers, d = d_s = {args.width}, K = 4; {args.rounds} profiled steps of each model, interleaved; "
          f"Vanilla Looped {vanilla * 1e3:.1f} ms a step")
    print(f"{'model':<18}{'ms/step':>9}{'fwd ms':>8}{'bwd ms':>8}{'rest / Vanilla':>16}{'branch / rest':>15}{'floor':>8}"
          f"{'x floor (q1, median, q3)':>28}")
    # rows: name -> ((step, forward, backward) per step, FLOP share floor, whether "rest / Vanilla" applies)
    table = {name: (steps[name], flops[name] / flops["vanilla_looped"] - 1, True) for name in MODELS[1:]}
    for i, piece in enumerate(PIECE_LABELS):  # each scored as if it were a branch added to the rest of the step
        timed = [(row[0], row[1 + 2 * i], row[2 + 2 * i]) for row in steps["vanilla_looped"]]
        table[piece] = (timed, piece_flops[piece] / (flops["vanilla_looped"] - piece_flops[piece]), False)
    for name, (rows, floor, versus_vanilla) in table.items():
        shares = [(f + b) / (s - f - b) for s, f, b in rows]
        q = quartiles([share / floor for share in shares])
        step, fwd, bwd = (statistics.median(col) for col in zip(*rows))
        rest = statistics.median(s - f - b for s, f, b in rows) / vanilla if versus_vanilla else None
        print(f"{name:<18}{step * 1e3:>9.1f}{fwd * 1e3:>8.1f}{bwd * 1e3:>8.1f}{'' if rest is None else f'{rest:.3f}':>16}"
              f"{100 * statistics.median(shares):>14.2f}%{100 * floor:>7.2f}%{q[0]:>12.2f}{q[1]:>8.2f}{q[2]:>8.2f}")
    print("fwd, bwd: the state branch's forward and backward inside the step (profiler ranges; autograd nodes by sequence "
          "number); rest / Vanilla: the step less the branch over Vanilla Looped's step (about 1 when nothing is missed); "
          "floor: the branch's training FLOPs over Vanilla's (models/flops.py); x floor: branch / rest over floor, per step; "
          "vanilla:<piece>: that sub-block of every backbone layer in Vanilla Looped's steps, scored as if it were a branch")


if __name__ == "__main__":
    main()
