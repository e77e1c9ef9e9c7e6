"""Caches for incremental decoding.

Every *application* of a layer sees different inputs, so a looped model keeps one KV cache per
(iteration, layer) pair: K x L caches for a K-times looped L-layer backbone. Token mixers over
the state keep their own cache per iteration (a KV cache for attention, convolution and SSM
states for Mamba-2). :class:`ModelCache` holds them all under hashable keys and counts the
tokens already processed, which is the RoPE offset of the next chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class KVCache:
    """Keys and values of one attention application, in buffers along the token axis that double
    when full (``capacity``: the initial size in tokens); ``update`` appends and returns views."""

    def __init__(self, capacity: int = 256) -> None:
        self._k: torch.Tensor | None = None  # (B, capacity, H, D)
        self._v: torch.Tensor | None = None
        self._len = 0
        self._capacity = capacity

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Append (B, T, H, D) keys and values; return everything cached so far."""
        n = self._len + k.shape[1]
        if self._k is None or n > self._k.shape[1]:
            self._grow(k, v, n)
        self._k[:, self._len : n] = k
        self._v[:, self._len : n] = v
        self._len = n
        return self._k[:, :n], self._v[:, :n]

    def _grow(self, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        size = max(self._capacity, needed, 2 * (0 if self._k is None else self._k.shape[1]))
        new_k = k.new_empty(k.shape[0], size, *k.shape[2:])
        new_v = v.new_empty(v.shape[0], size, *v.shape[2:])
        if self._len:
            new_k[:, : self._len] = self._k[:, : self._len]
            new_v[:, : self._len] = self._v[:, : self._len]
        self._k, self._v = new_k, new_v

    @property
    def k(self) -> torch.Tensor | None:
        """The cached keys (B, T_past, H, D), or None before the first update."""
        return None if self._k is None else self._k[:, : self._len]

    @property
    def v(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, : self._len]

    def __len__(self) -> int:
        return self._len


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
