"""Greedy generation, with the decoding cache or by recomputation.

Both functions take any registered model (``model(idx, cache=None) -> ModelOutput`` with logits
at every real token position) and return the same tokens: the cached path runs the prompt once
(prefill) and then one new token per call through the per-iteration caches of
:mod:`stateloop.models.cache`; the recomputing path runs the whole sequence again for every new
token. Their agreement is the end-to-end check of incremental decoding
(tests/models/test_generate.py); the cached path is what ``stateloop bench decode`` times.
"""

from __future__ import annotations

import torch

from stateloop.models.cache import ModelCache


@torch.inference_mode()
def greedy_generate(model, prompt: torch.Tensor, n_new: int, use_cache: bool = True, return_logits: bool = False):
    """prompt (B, P) token ids -> the n_new greedily chosen continuation tokens (B, n_new), and
    with ``return_logits`` also the logits each token was chosen from (B, n_new, V).

    With ``use_cache`` the prompt is prefilled in one pass and each new token is fed alone;
    otherwise every step recomputes the forward pass over prompt + tokens so far.
    """
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must have shape (B, P) with P >= 1, got {tuple(prompt.shape)}")
    tokens, logits = [], []
    cache = ModelCache() if use_cache else None
    seq, feed = prompt, prompt
    for _ in range(n_new):
        if use_cache:
            step_logits = model(feed, cache=cache).logits[:, -1]  # prefill first, then one token per call
        else:
            step_logits = model(seq).logits[:, -1]  # the whole sequence again
        feed = step_logits.argmax(-1, keepdim=True)  # (B, 1)
        tokens.append(feed)
        logits.append(step_logits)
        if not use_cache:
            seq = torch.cat([seq, feed], dim=1)
    out = torch.cat(tokens, 1) if tokens else prompt.new_zeros(prompt.shape[0], 0)
    if return_logits:
        return out, (torch.stack(logits, 1) if logits else None)
    return out
