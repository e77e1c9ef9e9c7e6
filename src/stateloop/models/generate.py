"""Greedy decoding, with the decoding cache or by recomputation: one stepper for every caller.

:func:`greedy_steps` is the only greedy loop in the package: the eval adapter's
``generate_until`` (stop strings, a restricted vocabulary), the latency benchmark (which times
each step) and :func:`greedy_generate` (tests, scripts) all drive it. With the cache the prompt
runs once (prefill) and then one new token per call through the per-iteration caches of
:mod:`stateloop.models.cache`; without it every step runs the whole sequence again. Both give
the same tokens, which is the end-to-end check of incremental decoding
(tests/models/test_generate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from stateloop.models.cache import ModelCache


def model_logits(model) -> Callable:
    """``forward(idx, cache) -> logits (B, T, V)`` for a registered model."""
    return lambda idx, cache: model(idx, cache=cache).logits


def greedy_steps(forward: Callable, prompt: torch.Tensor, use_cache: bool = True,
                 n_vocab: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Greedy decoding as a generator, without end: step i yields the i-th new token (B, 1) and
    the logits (B, V) it was chosen from. The first step runs the prompt (prefill); every later
    step runs only when asked for, so a caller that stops early computes nothing extra.

    ``forward(idx, cache)`` returns logits (B, T, V) (see :func:`model_logits`); ``n_vocab``
    restricts the choice to the first ids (e.g. those a tokenizer can decode).
    """
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must have shape (B, P) with P >= 1, got {tuple(prompt.shape)}")
    cache = ModelCache() if use_cache else None
    seq, feed = prompt, prompt
    while True:
        logits = forward(feed, cache)[:, -1] if use_cache else forward(seq, None)[:, -1]
        nxt = (logits if n_vocab is None else logits[:, :n_vocab]).argmax(-1, keepdim=True)
        yield nxt, logits
        if use_cache:
            feed = nxt  # only the new token goes through the caches
        else:
            seq = torch.cat([seq, nxt], dim=1)  # the whole sequence again


@torch.inference_mode()
def greedy_generate(model, prompt: torch.Tensor, n_new: int, use_cache: bool = True, return_logits: bool = False):
    """prompt (B, P) token ids -> the n_new greedily chosen continuation tokens (B, n_new), and
    with ``return_logits`` also the logits each token was chosen from (B, n_new, V)."""
    steps = greedy_steps(model_logits(model), prompt, use_cache)
    tokens, logits = [], []
    for _, (nxt, step_logits) in zip(range(n_new), steps):
        tokens.append(nxt)
        logits.append(step_logits)
    out = torch.cat(tokens, 1) if tokens else prompt.new_zeros(prompt.shape[0], 0)
    if return_logits:
        return out, (torch.stack(logits, 1) if logits else None)
    return out
