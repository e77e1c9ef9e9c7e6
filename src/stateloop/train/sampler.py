"""Random-access batches from memory-mapped token shards: batch = f(seed, step, rank, micro).

The training split (N tokens, documents separated by the end-of-document token; windows cross
document boundaries) is cut into ``n_windows = (N - 1) // seq_len`` non-overlapping windows of
seq_len + 1 tokens, window ``w`` covering tokens ``[w * seq_len, w * seq_len + seq_len + 1)``:

    window 0: tokens 0 .. T       inputs 0 .. T-1,    targets 1 .. T       (T = seq_len)
    window 1: tokens T .. 2T      inputs T .. 2T-1,   targets T+1 .. 2T
    window w: tokens wT .. (w+1)T

[choice] Consecutive windows share one boundary token, so every token but the first is a target
exactly once (a stride of seq_len + 1 would never predict 1 token in seq_len + 1). The tail that
does not fill a window is not read.

The stream is a sequence of epochs; epoch ``e`` visits every window once, in the order of a
permutation drawn from ``numpy.random.Generator(PCG64([seed, e]))`` (``shuffle`` of
``arange(n_windows)``; the same order as that generator's ``permutation(n_windows)``). Row
``row`` of optimiser step ``s`` is the global row ``g = s * global_batch + row`` of the stream:

    epoch = g // n_windows,   position = g % n_windows,   window = perm_epoch[position]

So "we train for 30B tokens" is one pass over 30B distinct tokens while ``total_steps *
global_batch <= n_windows``: no window is drawn twice (a paper run is one epoch: at 1.4B, 57,220
steps x 256 rows = 14,648,320 of the split's >= 14,648,437 windows; its 410M runs draw their 25B
tokens from the same 30B split, data/stage.py's ``data_homes``). A larger budget wraps into
further epochs, each with a fresh order.

Rank r takes, for micro-step m, the rows

    [(m * world + r) * micro_batch, (m * world + r + 1) * micro_batch)

of the step's global batch. Hence

- the data position is the step: a resume needs nothing else (the permutation is recomputed from
  (seed, epoch), not saved), and a step's global batch is the same on any number of devices;
- each process holds one or two epochs' permutations: 56 MiB at the paper's 14.6M windows.
"""

from __future__ import annotations

import numpy as np
import torch

from stateloop.data.shards import ShardSet, window_count

# Names the stream's construction; checkpoints record it, so a resume on another stream warns.
STREAM = "permuted-windows-v1"


def epoch_permutation(n_windows: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits windows 0 .. n_windows - 1: that of
    ``Generator(PCG64([seed, epoch])).permutation(n_windows)``, in int32 where it fits."""
    dtype = np.int32 if n_windows < 2**31 else np.int64
    perm = np.arange(n_windows, dtype=dtype)
    np.random.Generator(np.random.PCG64([seed, epoch])).shuffle(perm)
    return perm


class TokenSampler:
    def __init__(self, shards: ShardSet, seq_len: int, global_batch: int, micro_batch: int, world_size: int, seed: int):
        self.shards, self.seq_len, self.seed = shards, seq_len, seed
        self.global_batch, self.micro_batch, self.world_size = global_batch, micro_batch, world_size
        self.n_windows = window_count(shards, seq_len)  # windows of seq_len + 1 tokens at stride seq_len
        self._perms: dict[int, np.ndarray] = {}  # epoch -> permutation; at most two kept

    def permutation(self, epoch: int) -> np.ndarray:
        """Window order of ``epoch`` (cached: the current epoch and, across a boundary, the next)."""
        perm = self._perms.get(epoch)
        if perm is None:
            perm = epoch_permutation(self.n_windows, self.seed, epoch)
            if len(self._perms) >= 2:  # drop the cached epoch farthest from this one
                del self._perms[max(self._perms, key=lambda e: abs(e - epoch))]
            self._perms[epoch] = perm
        return perm

    def step_windows(self, step: int) -> np.ndarray:
        """Window indices (0 .. n_windows - 1) of the global batch of optimiser step ``step``."""
        g = step * self.global_batch + np.arange(self.global_batch, dtype=np.int64)
        epochs, positions = np.divmod(g, self.n_windows)
        out = np.empty(self.global_batch, dtype=np.int64)
        for epoch in np.unique(epochs):
            rows = epochs == epoch
            out[rows] = self.permutation(int(epoch))[positions[rows]]
        return out

    def step_starts(self, step: int) -> np.ndarray:
        """Start offsets (int64) of the global batch of optimiser step ``step``."""
        return self.step_windows(step) * self.seq_len

    def micro_batch_at(self, step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, seq_len) int64: targets are inputs shifted by one."""
        row = (micro * self.world_size + rank) * self.micro_batch
        starts = self.step_starts(step)[row : row + self.micro_batch]
        windows = np.stack([self.shards.window(int(s), self.seq_len + 1) for s in starts])  # (B, T + 1)
        t = torch.from_numpy(windows)
        return t[:, :-1], t[:, 1:]
