"""Held-out token perplexity on token shards (the paper's "Pile" column, and the NLL that the
analyses compare under interventions)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from stateloop.data.shards import open_split, window_count


def heldout_windows(shards, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Consecutive non-overlapping windows of seq_len + 1 tokens from the start of a split
    (input = window[:-1], target = window[1:]). Deterministic: the same windows every call."""
    n = window_count(shards, seq_len, max_windows)
    return torch.from_numpy(np.stack([shards.window(i * seq_len, seq_len + 1) for i in range(n)]))


def split_windows(data_dir, split: str, seq_len: int, max_windows: int | None = None):
    """Held-out windows of a data folder's split, with one-line errors for a missing split or one
    shorter than a window. Returns (windows, shards)."""
    shards = open_split(data_dir, split)
    return heldout_windows(shards, seq_len, max_windows), shards


@torch.no_grad()
def token_nll(model, windows: torch.Tensor, batch_size: int = 8, device="cpu", **forward_kwargs) -> torch.Tensor:
    """Summed NLL and token count per window: returns a (N, 2) float64 tensor [sum_nll, n_tokens]
    (their ratio is eq. (12)'s loss over the windows)."""
    out = []
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size].to(device)
        logits = model(batch[:, :-1], **forward_kwargs).logits.float()
        nll = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="none").view(batch.shape[0], -1)
        out.append(torch.stack([nll.sum(1).double().cpu(), torch.full((batch.shape[0],), nll.shape[1], dtype=torch.float64)], 1))
    return torch.cat(out)


def mean_nll(model, windows: torch.Tensor, batch_size: int = 8, device="cpu", **forward_kwargs) -> float:
    """Mean NLL per token over all windows (perplexity = exp of it)."""
    totals = token_nll(model, windows, batch_size, device, **forward_kwargs).sum(0)
    return float(totals[0] / totals[1])

