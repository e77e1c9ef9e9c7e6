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


@torch.no_grad()
def greedy_generate(model, prompt: torch.Tensor, n_new: int, use_cache: bool = True) -> torch.Tensor:
    """prompt (B, P) token ids -> the n_new greedily chosen continuation tokens (B, n_new).

    With ``use_cache`` the prompt is prefilled in one pass and each new token is fed alone;
    otherwise every step recomputes the forward pass over prompt + tokens so far.
    """
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must have shape (B, P) with P >= 1, got {tuple(prompt.shape)}")
    if n_new <= 0:
        return prompt.new_zeros(prompt.shape[0], 0)
    if use_cache:
        return _generate_cached(model, prompt, n_new)
    seq = prompt
    for _ in range(n_new):
        nxt = model(seq).logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[:, prompt.shape[1]:]


def _generate_cached(model, prompt: torch.Tensor, n_new: int) -> torch.Tensor:
    cache = ModelCache()
    out = prompt.new_empty(prompt.shape[0], n_new)
    nxt = model(prompt, cache=cache).logits[:, -1].argmax(-1, keepdim=True)  # prefill
    out[:, :1] = nxt
    for t in range(1, n_new):
        nxt = model(nxt, cache=cache).logits[:, -1].argmax(-1, keepdim=True)
        out[:, t : t + 1] = nxt
    return out
