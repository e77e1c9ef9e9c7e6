"""Random-access batches from memory-mapped token shards: batch = f(seed, step, rank, micro).

The training split (N tokens, documents separated by the end-of-document token; windows cross
document boundaries) is cut into ``n_windows = (N - 1) // seq_len`` non-overlapping windows of
seq_len + 1 tokens, window ``w`` covering tokens ``[w * seq_len, w * seq_len + seq_len + 1)``:

    window 0: tokens 0 .. T       inputs 0 .. T-1,    targets 1 .. T       (T = seq_len)
    window 1: tokens T .. 2T      inputs T .. 2T-1,   targets T+1 .. 2T
    window w: tokens wT .. (w+1)T

Consecutive windows share one boundary token (the last target of one is the first input of the
next), so over ``n_windows`` windows every token 1 .. n_windows * seq_len is a target exactly once
and every token 0 .. n_windows * seq_len - 1 an input exactly once. [choice] A stride of
seq_len + 1 would make windows disjoint, but then the first token of every window is never a
target: 1 token in seq_len + 1 of the data would never be predicted. The tail that does not fill
a window (fewer than seq_len tokens) is not read.

The stream is a sequence of epochs; epoch ``e`` visits every window once, in the order of a
permutation drawn from ``numpy.random.Generator(PCG64([seed, e]))`` (``shuffle`` of
``arange(n_windows)``; the same order as that generator's ``permutation(n_windows)``). Row
``row`` of optimiser step ``s`` is the global row ``g = s * global_batch + row`` of the stream:

    epoch = g // n_windows,   position = g % n_windows,   window = perm_epoch[position]

So "we train for 30B tokens", read as one pass over 30B distinct tokens, is exactly that while
``total_steps * global_batch <= n_windows``: no window is drawn twice, and no token of the split
goes unseen except the windows the budget does not reach. (configs/paper.yaml tokenizes
data.max_tokens = train.max_tokens training tokens, so a paper run is one epoch: at 1.4B,
57,220 steps x 256 rows = 14,648,320 of the split's >= 14,648,437 windows; its 410M runs train on
the same split, data/stage.py's ``data_homes``, and draw their 25B tokens from its 30B, none twice.) (Drawing window starts uniformly with
replacement, as this sampler did before, makes the number of times a token is a target Poisson(1)
distributed for a budget the size of the split: ~37% (1/e) of the tokens are never targets and
~26% (1 - 2/e) are targets twice or more.) A budget larger than the split wraps into further
epochs, each with a fresh order. A step whose rows straddle the end of an epoch takes its first
rows from one permutation and the rest from the next.

Rank r takes, for micro-step m, the rows

    [(m * world + r) * micro_batch, (m * world + r + 1) * micro_batch)

of the step's global batch. Hence

- the data position is the step: a resumed run needs nothing else to continue the same stream
  (the permutation is recomputed from (seed, epoch), not saved);
- the global batch of a step is the same whatever the number of devices or accumulation steps;
- nothing is loaded up front: each window is read from the memory map when it is needed.

Memory and time: each process holds the permutation of the current epoch (and, at an epoch
boundary, the next one): int32 while ``n_windows < 2**31``, else int64. At the paper's scale
(30e9 tokens / 2048 = 14.6M windows) that is 56 MiB per process (112 MiB as int64), computed in
about 0.6 s once per epoch and once at a resume.
"""

from __future__ import annotations

import numpy as np
import torch

from stateloop.data.shards import ShardSet

# Names the stream's construction; checkpoints record it, so a resume on another stream warns.
STREAM = "permuted-windows-v1"  # before: "uniform-starts" (window starts drawn with replacement)


def epoch_permutation(n_windows: int, seed: int, epoch: int) -> np.ndarray:
    """The order in which epoch ``epoch`` visits windows 0 .. n_windows - 1 (int32 when it fits).

    Equal to ``Generator(PCG64([seed, epoch])).permutation(n_windows)``, which shuffles an int64
    ``arange``; shuffling an int32 ``arange`` with the same generator gives the same order in
    half the memory."""
    dtype = np.int32 if n_windows < 2**31 else np.int64
    perm = np.arange(n_windows, dtype=dtype)
    np.random.Generator(np.random.PCG64([seed, epoch])).shuffle(perm)
    return perm


class TokenSampler:
    def __init__(self, shards: ShardSet, seq_len: int, global_batch: int, micro_batch: int, world_size: int, seed: int):
        if len(shards) < seq_len + 1:
            raise ValueError(f"{shards.dir}: split {shards.split!r} has {len(shards)} tokens, fewer than one window of {seq_len + 1}")
        self.shards, self.seq_len, self.seed = shards, seq_len, seed
        self.global_batch, self.micro_batch, self.world_size = global_batch, micro_batch, world_size
        self.n_windows = (len(shards) - 1) // seq_len  # windows of seq_len + 1 tokens at stride seq_len
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

    def epoch_at(self, step: int) -> float:
        """Epochs of the split completed before optimiser step ``step`` (0.5: half-way through the first)."""
        return step * self.global_batch / self.n_windows

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
