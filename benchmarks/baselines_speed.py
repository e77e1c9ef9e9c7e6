"""Training-step and decoding cost of the Table 1 baselines relative to Vanilla Looped.

Every model is built at one small shape that keeps the paper's structure (24 unique layers,
K = 4; MeSH and Parcae 8 + 8 x 10 + 8; Hyperloop 6 + 12 x 4 + 6 with 4 streams; PonderLM 4
passes; Pause Token 3 pauses) and timed side by side in this one process:

- step: forward + backward of a (B, T) batch with plain next-token CE;
- decode: prefill of T tokens, then one token at a time with the KV caches (per new token).

Prints milliseconds and the ratio to vanilla_looped. Usage:

    PYTHONPATH=src python benchmarks/baselines_speed.py [--d 128] [--T 128] [--batch 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from stateloop.config.model import ModelConfig
from stateloop.models.cache import ModelCache
from stateloop.models.registry import build_model

MODELS = {  # name -> (K, options): the paper's Table 1 structure
    "vanilla_looped": (4, {}),
    "hyperloop": (4, {"n_begin": 6, "n_middle": 12, "n_end": 6, "n_streams": 4}),
    "mesh": (10, {"n_prelude": 8, "n_core": 8, "n_coda": 8}),
    "ponderlm": (4, {}),
    "parcae": (10, {"n_prelude": 8, "n_core": 8, "n_coda": 8}),
    "pause_token": (4, {"n_pause": 3}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--decode", type=int, default=16, help="tokens decoded after the prefill")
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="rounds; each round times every model once, best round kept")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    idx = torch.randint(0, args.vocab - 1, (args.batch, args.T + args.decode))
    models, tasks = {}, {}
    for name, (K, options) in MODELS.items():
        cfg = ModelConfig(name=name, vocab_size=args.vocab, n_layers=24, d_model=args.d, d_ff=int(2.6875 * args.d),
                          n_heads=max(1, args.d // 64), head_dim=min(64, args.d), K=K, options=options, attn_impl="torch")
        model = models[name] = build_model(cfg)

        def step(model=model):
            model.train()
            model.zero_grad(set_to_none=True)
            logits = model(idx[:, : args.T]).logits
            F.cross_entropy(logits.flatten(0, 1), idx[:, 1 : args.T + 1].flatten()).backward()

        def decode(model=model):
            model.eval()
            with torch.no_grad():
                cache = ModelCache()
                model(idx[:1, : args.T], cache=cache)
                for t in range(args.T, args.T + args.decode):
                    model(idx[:1, t : t + 1], cache=cache)

        tasks[name] = (step, decode)
    best = {name: [float("inf"), float("inf")] for name in MODELS}
    for r in range(args.repeats + 1):  # round 0 warms up; models interleaved so load drifts hit all alike
        for name, fns in tasks.items():
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                if r:
                    best[name][i] = min(best[name][i], (time.perf_counter() - t0) * 1e3)
    base_step, base_decode = best["vanilla_looped"]
    print(f"d={args.d} T={args.T} batch={args.batch} decode={args.decode} threads={args.threads} rounds={args.repeats}")
    print(f"{'model':<16}{'layer apps':>11}{'step ms':>10}{'x vanilla':>10}{'prefill+decode ms':>19}{'x vanilla':>10}")
    for name, (s, d) in best.items():
        apps = models[name].n_layer_applications
        print(f"{name:<16}{apps:>11}{s:>10.1f}{s / base_step:>10.2f}{d:>19.1f}{d / base_decode:>10.2f}")


if __name__ == "__main__":
    main()
