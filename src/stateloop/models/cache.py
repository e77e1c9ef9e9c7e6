"""Caches for incremental decoding.

Every *application* of a layer sees different inputs, so a looped model keeps one KV cache per
(iteration, layer) pair: K x L caches for a K-times looped L-layer backbone. Token mixers over
the state keep their own cache per iteration (a KV cache for attention, convolution and SSM
states for Mamba-2). :class:`ModelCache` holds them all under hashable keys and counts the
tokens already processed, which is the RoPE offset of the next chunk.
"""

from __future__ import annotations

from typing import Callable

import torch


class KVCache:
    """Keys and values of one attention application, grown along the token axis."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Append (B, T, H, D) keys and values; return everything cached so far."""
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=1)
            self.v = torch.cat([self.v, v], dim=1)
        return self.k, self.v

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


class ModelCache:
    """All caches of one model for one batch of sequences being decoded."""

    def __init__(self) -> None:
        self.seq_len = 0  # tokens processed so far (positions of the next chunk start here)
        self._store: dict = {}

    def get(self, key, factory: Callable):
        if key not in self._store:
            self._store[key] = factory()
        return self._store[key]

    def kv_list(self, key, n: int) -> list[KVCache]:
        """n KV caches (one per layer) for the backbone application named ``key``."""
        return self.get(key, lambda: [KVCache() for _ in range(n)])

    def advance(self, n: int) -> None:
        self.seq_len += n
