"""Speed of the lm-eval adapter, measured side by side in one process (ratios, not absolute times).

1. loglikelihood requests/s: our ``stateloop`` lm-eval model against lm-eval's own HF backend
   (HFLM) on the same weights (a K=1 vanilla_looped copied into transformers' Llama).
2. greedy generation tokens/s: with the per-iteration KV cache against recomputing the whole
   sequence every step, for a looped model (K=4).

    PYTHONPATH=src:tests python benchmarks/eval_adapter.py [--device cpu|cuda] [--requests 64]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = "the a one cat dog bird fox sat ran saw over under on in near mat house tree hill big small red".split()
    rng = random.Random(0)
    text = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok, words


def timed(fn, repeat: int = 3) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=64)
    args = ap.parse_args()

    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import PreTrainedTokenizerFast

    from stateloop.evaluate.lm import StateLoopEvalLM
    from stateloop.fast import accelerate
    from stateloop.models.registry import build_model
    from support.models import tiny_config, to_transformers_llama

    tok, words = tokenizer(1000)
    eos = tok.token_to_id("<|endoftext|>")
    shape = dict(vocab_size=1024, n_layers=4, d_model=256, d_ff=704, n_heads=4, head_dim=64, max_seq_len=512)
    rng = random.Random(1)
    pairs = [(" ".join(rng.choice(words) for _ in range(rng.randint(20, 300))), " " + " ".join(rng.choice(words) for _ in range(3)))
             for _ in range(args.requests)]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]

    model = build_model(tiny_config("vanilla_looped", K=1, **shape)).eval()
    ours = StateLoopEvalLM(model=accelerate(model), tokenizer=tok, eos_id=eos, batch_size=16, device=args.device)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    theirs = HFLM(pretrained=to_transformers_llama(model).to(args.device), tokenizer=hf_tok, batch_size=16,
                  max_length=512, device=args.device, logits_cache=False)
    t_ours = timed(lambda: ours.loglikelihood(reqs, disable_tqdm=True))
    t_hf = timed(lambda: theirs.loglikelihood(reqs, disable_tqdm=True))
    print(f"loglikelihood, {args.requests} requests, K=1 d=256 L=4 on {args.device}: "
          f"ours {args.requests / t_ours:.1f} req/s, lm-eval HFLM {args.requests / t_hf:.1f} req/s, "
          f"ratio ours/HF = {t_hf / t_ours:.2f}")

    looped = build_model(tiny_config("stateloop", K=4, d_s=256, **shape)).eval()
    cached = StateLoopEvalLM(model=accelerate(looped), tokenizer=tok, eos_id=eos, batch_size=8, device=args.device)
    plain = StateLoopEvalLM(model=looped, tokenizer=tok, eos_id=eos, batch_size=8, device=args.device, use_cache=False)
    prompt = " ".join(words * 8)  # same length for all: one decoding batch
    gen = [Instance("generate_until", {}, (prompt, {"until": ["<<never>>"], "max_gen_toks": args.gen_tokens}), i) for i in range(8)]
    t_c = timed(lambda: cached.generate_until(gen, disable_tqdm=True), repeat=2)
    t_p = timed(lambda: plain.generate_until(gen, disable_tqdm=True), repeat=2)
    n_ctx = len(tok.encode(prompt, add_special_tokens=False).ids)
    assert cached.generate_until(gen[:1], disable_tqdm=True) == plain.generate_until(gen[:1], disable_tqdm=True)
    print(f"greedy generation, stateloop K=4, batch 8, {n_ctx}-token prompt, up to {args.gen_tokens} tokens: "
          f"KV cache {t_p / t_c:.2f}x faster than recomputation ({t_c:.2f} s vs {t_p:.2f} s)")


if __name__ == "__main__":
    main()
