"""Random-access batches from memory-mapped token shards: batch = f(seed, step, rank, micro).

Optimiser step s draws the start offsets of its ``global_batch`` windows from a generator seeded
with (seed, s) alone, uniformly over every position where a window of seq_len + 1 tokens fits
(windows may cross document boundaries; documents are separated by the end-of-document token).
Rank r takes, for micro-step m, the rows

    [(m * world + r) * micro_batch, (m * world + r + 1) * micro_batch)

of that list. Hence

- the data position is the step: a resumed run needs nothing else to continue the same stream;
- the global batch of a step is the same whatever the number of devices or accumulation steps;
- nothing is loaded up front: each window is read from the memory map when it is needed.
"""

from __future__ import annotations

import numpy as np
import torch

from stateloop.data.shards import ShardSet


class TokenSampler:
    def __init__(self, shards: ShardSet, seq_len: int, global_batch: int, micro_batch: int, world_size: int, seed: int):
        if len(shards) < seq_len + 1:
            raise ValueError(f"{shards.dir}: split {shards.split!r} has {len(shards)} tokens, fewer than one window of {seq_len + 1}")
        self.shards, self.seq_len, self.seed = shards, seq_len, seed
        self.global_batch, self.micro_batch, self.world_size = global_batch, micro_batch, world_size
        self.n_starts = len(shards) - seq_len  # valid starts: 0 .. len - (seq_len + 1)

    def step_starts(self, step: int) -> np.ndarray:
        """Start offsets of the global batch of optimiser step ``step``."""
        rng = np.random.Generator(np.random.PCG64([self.seed, step]))
        return rng.integers(0, self.n_starts, size=self.global_batch, dtype=np.int64)

    def micro_batch_at(self, step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (micro_batch, seq_len) int64: targets are inputs shifted by one."""
        row = (micro * self.world_size + rank) * self.micro_batch
        starts = self.step_starts(step)[row : row + self.micro_batch]
        windows = np.stack([self.shards.window(int(s), self.seq_len + 1) for s in starts])  # (B, T + 1)
        t = torch.from_numpy(windows)
        return t[:, :-1], t[:, 1:]
