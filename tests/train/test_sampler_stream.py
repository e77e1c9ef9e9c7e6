"""The training token stream (train/sampler.py): a seeded permutation of non-overlapping windows
per epoch, a pure function of (seed, step, rank, micro).

The split used here holds its own positions as token ids (token i == i), so a batch's targets
are the positions it trains on."""

from __future__ import annotations

import numpy as np
import pytest

from stateloop.data.shards import ShardSet, ShardWriter, token_dtype, write_meta
from stateloop.train.sampler import TokenSampler
from support.training import write_shards

SEQ = 16
N_TOKENS = 5_025  # (5025 - 1) // 16 = 314 windows; tokens 5025 - 1 - 314 * 16 = 0 left over after the last target


def positional_shards(folder, n_tokens: int = N_TOKENS, shard_tokens: int = 700) -> ShardSet:
    """A train split whose token i is the id i (uint16), cut into several shard files."""
    dtype = token_dtype(2**16)
    writer = ShardWriter(folder, "train", dtype, shard_tokens=shard_tokens)
    writer.add(np.arange(n_tokens))
    write_meta(folder, {"dtype": dtype.name, "vocab_size": 2**16, "eos_id": 0, "tokenizer": {"kind": "test-positions"},
                        "splits": {"train": writer.close()}})
    return ShardSet(folder, "train")


def global_rows(sampler: TokenSampler, steps, world: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of the global batches of ``steps``, in global row order, assembled from
    every rank's micro-batches."""
    xs, ys = [], []
    accum = sampler.global_batch // (sampler.micro_batch * world)
    for step in steps:
        x = np.empty((sampler.global_batch, sampler.seq_len), dtype=np.int64)
        y = np.empty_like(x)
        for micro in range(accum):
            for rank in range(world):
                row = (micro * world + rank) * sampler.micro_batch
                xb, yb = sampler.micro_batch_at(step, micro, rank)
                x[row : row + sampler.micro_batch], y[row : row + sampler.micro_batch] = xb.numpy(), yb.numpy()
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)


def test_no_window_repeats_within_an_epoch(tmp_path):
    """'"30B training tokens" means one pass over 30B distinct tokens': within one epoch no
    window is drawn twice, and no two windows overlap (beyond the one boundary token that is the
    last target of one window and the first input of the next), so no token is a target twice."""
    shards = positional_shards(tmp_path / "d")
    sampler = TokenSampler(shards, seq_len=SEQ, global_batch=8, micro_batch=2, world_size=1, seed=3)
    n_windows = (len(shards) - 1) // SEQ
    steps = -(-n_windows // 8)
    starts = np.concatenate([sampler.step_starts(s) for s in range(steps)])[:n_windows]
    assert len(np.unique(starts)) == n_windows, "a window start repeats within the epoch"
    _, targets = global_rows(sampler, range(steps))
    targets = targets[:n_windows].ravel()
    assert len(np.unique(targets)) == targets.size, "a token is a target twice within the epoch"


def test_one_epoch_covers_the_split(tmp_path):
    """'"30B training tokens" means one pass over 30B distinct tokens': after one epoch every
    token that can be a target (1 .. n_windows * seq_len; the tail shorter than a window is not
    read) has been a target exactly once, and every token before it an input exactly once."""
    n_tokens = N_TOKENS + 9  # 9 tokens of tail that do not fill a window
    shards = positional_shards(tmp_path / "d", n_tokens=n_tokens)
    sampler = TokenSampler(shards, seq_len=SEQ, global_batch=8, micro_batch=4, world_size=1, seed=11)
    n_windows = (n_tokens - 1) // SEQ
    inputs, targets = global_rows(sampler, range(-(-n_windows // 8)))
    inputs, targets = inputs[:n_windows], targets[:n_windows]
    assert np.array_equal(np.sort(targets.ravel()), np.arange(1, n_windows * SEQ + 1))
    assert np.array_equal(np.sort(inputs.ravel()), np.arange(0, n_windows * SEQ))
    assert np.array_equal(targets, inputs + 1)  # targets are inputs shifted by one
    assert targets.max() == n_tokens - 1 - 9  # the 9-token tail is never read
    assert sampler.n_windows == n_windows == 314


def test_the_next_epoch_is_a_different_order(tmp_path):
    """"we train for 30B tokens": a budget beyond the split wraps into a second epoch, which again
    visits every window once but in a fresh order drawn from (seed, epoch); a step that straddles
    the end of an epoch takes its first rows from one order and the rest from the next."""
    from stateloop.train.sampler import epoch_permutation

    shards = positional_shards(tmp_path / "d")
    sampler = TokenSampler(shards, seq_len=SEQ, global_batch=8, micro_batch=8, world_size=1, seed=5)
    n = sampler.n_windows  # 314 = 39 * 8 + 2: step 39 straddles the boundary
    rows = np.concatenate([sampler.step_starts(s) for s in range(2 * n // 8 + 1)]) // SEQ
    first, second = rows[:n], rows[n : 2 * n]
    assert sorted(first) == sorted(second) == list(range(n))  # each epoch: every window once
    assert not np.array_equal(first, second)  # ... in another order
    perm0, perm1 = epoch_permutation(n, 5, 0), epoch_permutation(n, 5, 1)
    assert np.array_equal(first, perm0) and np.array_equal(second, perm1)
    assert np.array_equal(sampler.step_starts(39) // SEQ, np.concatenate([perm0[312:], perm1[:6]]))
    # The documented definition: numpy's Generator(PCG64([seed, epoch])).permutation.
    assert np.array_equal(perm1, np.random.Generator(np.random.PCG64([5, 1])).permutation(n))
    other_seed = TokenSampler(shards, SEQ, 8, 8, 1, seed=6)
    assert not np.array_equal(other_seed.step_starts(0), sampler.step_starts(0))


@pytest.mark.parametrize("step", [0, 7, 39, 80])  # 39: straddles the end of the first epoch
def test_global_batch_is_identical_across_world_sizes_and_micro_batches(tmp_path, step):
    """"we train for 30B tokens": the tokens a step trains on do not depend on how the global batch
    is split over 1, 2 or 4 devices and accumulation steps."""
    shards = positional_shards(tmp_path / "d")
    reference = global_rows(TokenSampler(shards, SEQ, 8, 8, 1, seed=2), [step])
    for world in (1, 2, 4):
        for micro in (1, 2, 4, 8):
            if 8 % (micro * world):
                continue
            got = global_rows(TokenSampler(shards, SEQ, 8, micro, world, seed=2), [step], world=world)
            assert np.array_equal(got[0], reference[0]) and np.array_equal(got[1], reference[1]), (world, micro)


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    """"we train for 30B tokens" (and resume anywhere inside them): a step's batch depends on
    (seed, step) alone, so asking for steps out of order, across epochs and back, or from a fresh
    sampler (a resumed run) gives the same tokens as an uninterrupted pass."""
    data = write_shards(tmp_path / "d", n_train=3_000, n_val=500, shard_tokens=700)
    shards = ShardSet(data, "train")
    in_order = TokenSampler(shards, SEQ, 8, 2, 1, seed=9)
    steps = list(range(60))  # 187 windows: about 2.6 epochs
    want = {s: global_rows(in_order, [s]) for s in steps}
    rng = np.random.default_rng(0)
    jumpy = TokenSampler(shards, SEQ, 8, 4, 2, seed=9)
    for s in rng.permutation(steps + steps):
        x, y = global_rows(jumpy, [int(s)], world=2)
        assert np.array_equal(x, want[s][0]) and np.array_equal(y, want[s][1]), s
    resumed = TokenSampler(shards, SEQ, 8, 2, 1, seed=9)
    assert np.array_equal(global_rows(resumed, [47])[1], want[47][1])


def test_resuming_a_checkpoint_of_the_old_stream_warns(capsys):
    """A checkpoint written before the stream became a permutation of windows (it records no
    stream) resumes with a warning that its batches differ from an uninterrupted run's."""
    from stateloop.train.run_folder import check_resume
    from stateloop.train.sampler import STREAM

    cfg = {"model": {"d_model": 8}, "train": {"seed": 0, "seq_len": 8, "global_batch": 4}}
    data = {"dir": "d", "split": "train", "tokens": 100, "fingerprint": "f", "stream": STREAM}
    check_resume("step_00000004.ckpt", cfg, cfg, {**data, "stream": STREAM}, data, 4)
    assert "batch stream" not in capsys.readouterr().err
    old = {k: v for k, v in data.items() if k != "stream"}
    check_resume("step_00000004.ckpt", cfg, cfg, old, data, 4)
    err = capsys.readouterr().err
    assert "'uniform-starts' batch stream" in err and STREAM in err
