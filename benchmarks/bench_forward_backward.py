"""Forward+backward time of the StateLoop variants relative to Vanilla Looped, side by side.

Paper-shaped small config (24 layers, d = d_s = 128, K = 4, SwiGLU width 344 = 2.6875 d as at
1.4B, GPT-NeoX vocabulary), fp32 on CPU. The models are timed in interleaved rounds, so load on
the machine hits all of them alike; the script prints the median time per step and its ratio to
vanilla_looped. The paper's parameter overheads (+1.2%, +2.4%, +3.3% at 1.4B) are printed beside
the measured parameter overheads at this shape.

    python benchmarks/bench_forward_backward.py [--batch 4] [--seq 256] [--rounds 5] [--layers 8 --width 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stateloop.models.config import ModelConfig
from stateloop.models.flops import compute_profile
from stateloop.models.registry import build_model, count_params

MODELS = ["vanilla_looped", "stateloop", "stateloop_attn", "stateloop_mamba2"]
PAPER_PARAM_OVERHEAD = {"stateloop": 1.18, "stateloop_attn": 2.36, "stateloop_mamba2": 3.26}


def config(name: str, vocab: int, layers: int = 24, d: int = 128, groups: int = 1) -> ModelConfig:
    """d = d_s, SwiGLU 2.6875 d rounded to 8, heads of 64 (the mixers' too)."""
    return ModelConfig(
        name=name, vocab_size=vocab, n_layers=layers, d_model=d, d_ff=8 * round(2.6875 * d / 8), n_heads=d // 64,
        head_dim=64, K=4, d_s=d if name != "vanilla_looped" else 0, max_seq_len=1024, mixer_heads=d // 64,
        mixer_head_dim=64, mamba_expand=2, mamba_d_state=128, mamba_d_conv=4, mamba_head_dim=64, mamba_n_groups=groups,
    )


def step_time(model, idx) -> float:
    t0 = time.perf_counter()
    logits = model(idx).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=50432)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=128, help="d = d_s")
    ap.add_argument("--groups", type=int, default=1, help="Mamba-2 groups of heads (1.4B: 8)")
    args = ap.parse_args()
    torch.manual_seed(0)

    def cfg(name):
        return config(name, args.vocab, args.layers, args.width, args.groups)

    models = {name: build_model(cfg(name)) for name in MODELS}
    idx = torch.randint(0, args.vocab, (args.batch, args.seq))
    for m in models.values():  # warm-up
        step_time(m, idx)
    times = {name: [] for name in MODELS}
    for _ in range(args.rounds):
        for name, m in models.items():
            times[name].append(step_time(m, idx))
    base_t = statistics.median(times["vanilla_looped"])
    base_p = count_params(cfg("vanilla_looped"))
    flops = {name: compute_profile(cfg(name), args.seq).flops_per_token for name in MODELS}  # forward + backward
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq} tokens, "
          f"{args.rounds} interleaved rounds (median); {args.layers} layers, d = d_s = {args.width}, "
          f"Mamba-2 {args.groups} group(s)")
    print(f"{'model':<18}{'ms/step':>10}{'time ratio':>12}{'FLOP ratio':>12}{'x floor':>9}{'(q1, q3)':>14}{'params':>12}"
          f"{'param +%':>10}{'paper +% (1.4B)':>17}")
    for name in MODELS:
        t = statistics.median(times[name])
        p = count_params(cfg(name))
        paper = PAPER_PARAM_OVERHEAD.get(name)
        floor = flops[name] / flops["vanilla_looped"]
        times_floor = spread = ""
        if floor > 1:
            times_floor = f"{(t / base_t - 1) / (floor - 1):.2f}"
            if args.rounds >= 4:  # the same ratio in each round, vanilla timed beside it: how far one round moves it
                q = statistics.quantiles([(a / b - 1) / (floor - 1) for a, b in zip(times[name], times["vanilla_looped"])], n=4)
                spread = f"({q[0]:.2f}, {q[2]:.2f})"
        print(f"{name:<18}{t * 1e3:>10.1f}{t / base_t:>12.3f}{floor:>12.3f}{times_floor:>9}{spread:>14}{p:>12,}"
              f"{100 * (p / base_p - 1):>10.2f}{'' if paper is None else f'{paper:+.2f}':>17}")
    print("FLOP ratio: training FLOPs per token against vanilla_looped (models/flops.py); x floor: (time ratio - 1) / "
          "(FLOP ratio - 1), the state branch's time over its arithmetic share, from the medians; (q1, q3): its quartiles "
          "over the rounds, each round's step against vanilla's in the same round")


if __name__ == "__main__":
    main()
