"""Activation memory and step time of activation checkpointing and the chunked loss, side by side.

For each model (Vanilla Looped and StateLoop by default) at a moderate shape (d = d_s = 512, 8 layers,
K = 4, SwiGLU 2.6875 d as at 1.4B, heads of 64, the GPT-NeoX vocabulary of 50,432, micro-batch
2 x 512 tokens), under bf16 autocast as Lightning Fabric's bf16-mixed runs on a CPU:

- the bytes autograd saves for backward in one training forward and loss
  (support.memory_probe.saved_bytes: distinct storages, parameters excluded), and
- the time of one training step (forward, loss, backward), timed in interleaved rounds so that load
  on the machine hits every setting alike: the median time and the median over rounds of the time
  relative to the reference measured in the same round (each round in another order),

for train.activation_checkpointing none / layer / iteration and train.loss_chunk_tokens 0 / --chunk,
and for StateLoop also "layer" with its state branch left un-checkpointed (the [choice] of
StateLoopLM.checkpoint_units). Then the per-token figures a memory plan scales: bytes per token of
the micro-batch, and per token and decoder-layer application (memory_probe.layer_application_bytes:
one more layer in the stack), at this width; with --paper also measured at the paper's 1.4B width
(d = d_s = 2048, 1 and 2 layers, 64 tokens) and extrapolated to its 24 layers, K = 4 and
micro-batch 4 x 2048, exactly linear in layers and tokens.

    python benchmarks/bench_memory.py [--models vanilla_looped stateloop] [--rounds 3] [--paper]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

from stateloop.config.model import ModelConfig
from stateloop.models.looped import StateLoopLM
from stateloop.models.registry import build_model
from stateloop.train import checkpointing
from stateloop.train.loss import lm_loss

# the probe lives in tests/support, beside the tests that check the plan with it
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.memory_probe import activation_bytes, saved_bytes  # noqa: E402

MiB, GiB = 2.0**20, 2.0**30


def config(name: str, vocab: int, layers: int, d: int, K: int = 4) -> ModelConfig:
    has_state = name != "vanilla_looped"
    return ModelConfig(name=name, vocab_size=vocab, n_layers=layers, d_model=d, d_ff=8 * round(2.6875 * d / 8),
                       n_heads=d // 64, head_dim=64, K=K, d_s=d if has_state else 0, max_seq_len=2048,
                       attn_impl="torch", ssd_impl="torch")


@contextlib.contextmanager
def branch_unit(unit: str | None):
    """StateLoop's state branch a unit of its own under "layer" ("layer") or not (None), for the
    duration (StateLoopLM.checkpoint_units, the class's declaration)."""
    before = StateLoopLM.checkpoint_units
    if unit is None:
        StateLoopLM.checkpoint_units = {level: m for level, m in before.items() if level != "layer"}
    try:
        yield
    finally:
        StateLoopLM.checkpoint_units = before


def variants(name: str, chunk: int) -> list[tuple[str, str, int, str | None]]:
    """(label, checkpointing, loss chunk tokens, the state branch's unit level)."""
    out = [("none", "none", 0, "layer"), ("layer", "layer", 0, "layer"), ("iteration", "iteration", 0, "layer"),
           (f"none + loss/{chunk}", "none", chunk, "layer"), (f"iteration + loss/{chunk}", "iteration", chunk, "layer")]
    if name != "vanilla_looped":
        out.insert(2, ("layer, branch kept", "layer", 0, None))
    return out


def step_time(model, x, y, chunk: int) -> float:
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_loss(model, x, y, chunk)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def bench_model(name: str, args) -> None:
    cfg = config(name, args.vocab, args.layers, args.width)
    torch.manual_seed(0)
    model = build_model(cfg)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    rows = variants(name, args.chunk)
    saved = {}
    for label, level, chunk, unit in rows:
        with branch_unit(unit):
            saved[label] = saved_bytes(cfg, batch=args.batch, seq_len=args.seq, activation_checkpointing=level,
                                       loss_chunk_tokens=chunk, model=model)
    times = {label: [] for label, *_ in rows}
    for r in range(args.rounds + 1):  # round 0 warms up (allocator, kernels) and is dropped
        for label, level, chunk, unit in rows[r % len(rows):] + rows[: r % len(rows)]:  # each round starts elsewhere
            with branch_unit(unit), checkpointing.checkpointed(model, level):
                t = step_time(model, x, y, chunk)
            if r:
                times[label].append(t)
    ref = rows[0][0]
    print(f"\n{name}: d = d_s = {args.width}, {args.layers} layers, K = {cfg.K}, {args.batch} x {args.seq} tokens, "
          f"vocab {args.vocab}, bf16 autocast, {torch.get_num_threads()} thread(s), {args.rounds} rounds")
    print(f"  {'setting':<26}{'saved MiB':>10}{'x none':>8}{'step s':>9}{'time x none':>13}{'(min-max)':>14}")
    for label, *_ in rows:
        ratios = [t / t0 for t, t0 in zip(times[label], times[ref])]
        print(f"  {label:<26}{saved[label] / MiB:>10.1f}{saved[label] / saved[ref]:>8.3f}"
              f"{statistics.median(times[label]):>9.2f}{statistics.median(ratios):>13.3f}"
              f"{f'{min(ratios):.2f}-{max(ratios):.2f}':>14}")
    if not args.no_per_token:
        per_token(name, args.vocab, args.layers, args.width, args.chunk, seq=64, tokens=args.batch * args.seq, K=cfg.K)


def per_token(name: str, vocab: int, layers: int, d: int, chunk: int, seq: int, tokens: int, K: int,
              extrapolate_layers: int | None = None) -> None:
    """Bytes per token of the micro-batch at ``layers`` and ``layers + 1`` layers (probes at ``seq``
    tokens, batch 1 and 2): per decoder-layer application, and the rest; with ``extrapolate_layers``
    the saved bytes of that many layers at ``tokens`` tokens per micro-batch."""
    models = {n: build_model(config(name, vocab, n, d)) for n in (layers, layers + 1)}
    print(f"  per token ({name}, d = {d}, probed at {seq} tokens; a = bytes per token and layer application):")
    print(f"  {'setting':<26}{'bytes/token':>12}{'a':>9}{'a / d':>8}{'fixed MiB':>10}"
          + (f"{f'GiB at {extrapolate_layers} x {tokens}':>22}" if extrapolate_layers else ""))
    for level in ("none", "layer", "iteration"):
        for c in (0, chunk):
            fits = {n: activation_bytes(config(name, vocab, n, d), seq_len=seq, model=m, activation_checkpointing=level,
                                        loss_chunk_tokens=c) for n, m in models.items()}
            a = (fits[layers + 1].per_token - fits[layers].per_token) / K
            label = level + (f" + loss/{c}" if c else "")
            line = f"  {label:<26}{fits[layers].per_token:>12,.0f}{a:>9,.0f}{a / d:>8.2f}{fits[layers].fixed / MiB:>10.1f}"
            if extrapolate_layers:
                extra = extrapolate_layers - layers
                fixed = fits[layers].fixed + extra * (fits[layers + 1].fixed - fits[layers].fixed)
                total = fixed + tokens * (fits[layers].per_token + extra * K * a)
                line += f"{total / GiB:>22.2f}"
            print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vanilla_looped", "stateloop"])
    ap.add_argument("--width", type=int, default=512, help="d = d_s")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=50432)
    ap.add_argument("--chunk", type=int, default=256, help="train.loss_chunk_tokens of the chunked rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paper", action="store_true", help="also the per-token figures at the 1.4B width, extrapolated")
    ap.add_argument("--no-timing", action="store_true", help="the per-token figures only")
    ap.add_argument("--no-per-token", action="store_true", help="the table of settings only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models:
        if args.no_timing:
            print(f"\n{name}:")
            per_token(name, args.vocab, args.layers, args.width, args.chunk, seq=64, tokens=args.batch * args.seq, K=4)
        else:
            bench_model(name, args)
        if args.paper:
            print(f"\n{name} at the 1.4B width (d = d_s = 2048, f = 5504, 32 heads), extrapolated to 24 layers, K = 4, "
                  f"micro-batch 4 x 2048, loss chunks of 1024:")
            per_token(name, 50432, 1, 2048, 1024, seq=64, tokens=4 * 2048, K=4, extrapolate_layers=24)


if __name__ == "__main__":
    main()
