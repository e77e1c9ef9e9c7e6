"""Schedule, sampler and config checks: hand computations and one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stateloop.cli import main
from stateloop.config import ConfigError
from stateloop.config.train import TrainConfig
from stateloop.data.shards import ShardSet
from stateloop.train.sampler import TokenSampler
from stateloop.train.schedule import lr_at
from support.training import resolved, write_config, write_shards


def test_schedule_by_hand():
    # peak 1.0, floor 0.1, 4 warmup steps, 14 steps: cosine over the 10 steps after warmup.
    lr = [lr_at(s, 1.0, 0.1, 4, 14) for s in range(14)]
    assert lr[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lr[4] == pytest.approx(1.0)  # progress 0
    assert lr[9] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # progress 1/2: 0.55
    assert lr[9] == pytest.approx(0.55)
    assert lr[13] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.9)))
    assert all(a >= b for a, b in zip(lr[4:], lr[5:]))  # monotone decay
    assert lr_at(20, 1.0, 0.1, 4, 14) == pytest.approx(0.1)  # the floor, past the end
    assert lr_at(9, 1.0, 0.1, 4, 14, "constant") == 1.0


def test_sampler_reads_windows_and_ignores_world_size(tmp_path):
    data = write_shards(tmp_path / "d", n_train=5_000, n_val=500, shard_tokens=700)  # windows cross shard files
    shards = ShardSet(data, "train")
    flat = np.concatenate([np.asarray(m) for m in shards.maps]).astype(np.int64)
    one = TokenSampler(shards, seq_len=16, global_batch=8, micro_batch=2, world_size=1, seed=3)
    two = TokenSampler(shards, seq_len=16, global_batch=8, micro_batch=2, world_size=2, seed=3)
    starts = one.step_starts(5)
    assert starts.min() >= 0 and starts.max() <= len(flat) - 17
    rows_one = [one.micro_batch_at(5, m, 0) for m in range(4)]  # 4 micro-batches on one device
    rows_two = [two.micro_batch_at(5, m, r) for m in range(2) for r in range(2)]  # 2 x 2 devices
    for (x1, y1), (x2, y2) in zip(rows_one, rows_two):
        assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    x, y = rows_one[1]
    for i, s in enumerate(starts[2:4]):
        assert np.array_equal(x[i].numpy(), flat[s : s + 16]) and np.array_equal(y[i].numpy(), flat[s + 1 : s + 17])
    assert not np.array_equal(one.step_starts(6), starts)  # another step, another batch
    assert np.array_equal(TokenSampler(shards, 16, 8, 2, 1, seed=3).step_starts(5), starts)  # f(seed, step) only


def test_train_config_arithmetic_and_errors():
    cfg = TrainConfig(devices=2, num_nodes=2, micro_batch=4, global_batch=64, seq_len=128, max_tokens=64 * 128 * 10 + 5)
    assert (cfg.world_size, cfg.accumulation, cfg.tokens_per_step, cfg.total_steps) == (4, 4, 8192, 10)
    with pytest.raises(ConfigError, match=r"^train\.global_batch: 30 sequences is not a multiple"):
        TrainConfig(micro_batch=4, global_batch=30)
    with pytest.raises(ConfigError, match=r"^train\.strategy: must be one of ddp, fsdp"):
        TrainConfig(strategy="deepspeed")
    with pytest.raises(ConfigError, match=r"^train\.max_tokens: set a token budget"):
        TrainConfig().check_budget()


@pytest.mark.parametrize(
    "overrides, data_kind, pattern",
    [
        (["train.lrr=1"], "ok", r"^train\.lrr: unknown key \(allowed: "),
        (["train.lr=fast"], "ok", r"^train\.lr: expected a number, got 'fast'"),
        (["train.micro_batch=3"], "ok", r"^train\.global_batch: 8 sequences is not a multiple"),
        (["model.K=5"], "ok", r"^model\.K: set by the run id"),
        (["optim.lr=1"], "ok", r"^optim: unknown section"),
        (["train.seq_len=100"], "ok", r"^train\.seq_len: 100 exceeds model\.max_seq_len = 64"),
        ([], "missing", r"/nope: data folder not found"),
        ([], "empty", r"/empty/meta\.json: no token shards here"),
        ([], "big_vocab", r"/big/meta\.json: the tokenizer's vocabulary \(200 ids\) does not fit model\.vocab_size = 96"),
        (["train.val_split=test"], "ok", r"/data/meta\.json: no split 'test' \(has: train, val\)"),
    ],
)
def test_errors_are_one_line_naming_the_key_or_file(tmp_path, capsys, overrides, data_kind, pattern):
    cfg = write_config(tmp_path / "cfg.yaml")
    data = {"ok": lambda: write_shards(tmp_path / "data", n_train=2_000, n_val=500),
            "missing": lambda: tmp_path / "nope",
            "empty": lambda: (tmp_path / "empty").mkdir() or tmp_path / "empty",
            "big_vocab": lambda: write_shards(tmp_path / "big", n_train=2_000, n_val=500, vocab=200)}[data_kind]()
    rc = main(["train", "--config", str(cfg), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
               "--out", str(tmp_path / "run"), "--set", *overrides])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("stateloop train: error: ")
    import re

    assert re.search(pattern, err.removeprefix("stateloop train: error: ")), err
    assert not (tmp_path / "run").exists()  # nothing started


def test_run_id_errors(tmp_path):
    cfg = write_config(tmp_path / "cfg.yaml")
    with pytest.raises(ConfigError, match=r"^RUN: expected \{scale\}/\{model\}/K\{K\}_ds\{ds\}_seed\{seed\}"):
        resolved(cfg, tmp_path, "t/stateloop/K2")
    with pytest.raises(ConfigError, match=r"^RUN: expected"):
        resolved(cfg, tmp_path, "t/stateloop/K2_ds32")  # the seed is always spelled
    with pytest.raises(ConfigError, match=r"^train.seed: set by the run id"):
        resolved(cfg, tmp_path, "t/stateloop/K2_ds32_seed7", ["train.seed=8"])
    # the run id's seed is the training seed (init and data order)
    assert resolved(cfg, tmp_path, "t/stateloop/K2_ds32_seed7")["train"]["seed"] == 7
    with pytest.raises(ConfigError, match=r"^RUN: unknown scale 'big'"):
        resolved(cfg, tmp_path, "big/stateloop/K2_ds32_seed1234")
    with pytest.raises(ConfigError,
                       match=r"^model.d_s: vanilla_looped has no persistent state, so d_s must be 0 \(ds0 in its run ids\), got 32$"):
        resolved(cfg, tmp_path, "t/vanilla_looped/K3_ds32_seed1234")
    with pytest.raises(ConfigError, match=r"^model.name: unknown model 'nope'"):
        resolved(cfg, tmp_path, "t/nope/K2_ds0_seed1234")
    # The request: "Today a run id that is not in the config (tiny/stateloop/K9_ds64) silently starts
    # a training run." A K, seed or model the experiments do not list is refused, naming its neighbours.
    for run in ("t/vanilla_looped/K5_ds0_seed1234", "t/stateloop/K2_ds32_seed8", "t/stateloop/K2_ds64_seed7"):
        with pytest.raises(ConfigError, match=rf"^RUN: {run} is not a run of .*cfg.yaml; add it to an experiment "
                                              rf"there \(its runs like it: t/{run.split('/')[1]}/K2_"):
            resolved(cfg, tmp_path, run)
    cfg_dict = resolved(cfg, tmp_path, "t/vanilla_looped/K3_ds0_seed1234", ["train.lr=1e-3"])
    assert cfg_dict["model"]["K"] == 3 and cfg_dict["train"]["lr"] == 1e-3 and cfg_dict["run"]["experiments"] == ["e"]


@pytest.mark.parametrize("name", ["smoke", "tiny"])
def test_shipped_small_configs_resolve_every_run(name, tmp_path):
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline

    path = Path(__file__).resolve().parents[2] / "configs" / f"{name}.yaml"
    runs = expand_runs(load_pipeline(path))
    assert len(runs) >= 10
    for run in runs:
        cfg = resolved(path, tmp_path, run.id)
        tcfg = TrainConfig(**cfg["train"])
        assert tcfg.precision == "32-true" and tcfg.accelerator == "cpu" and tcfg.total_steps > 0


@pytest.mark.parametrize("K", [1, 3])
def test_flops_per_sequence_by_hand(K):
    """Forward: 2 T (K L (4 d^2 + 3 d f) + d V) for the matmuls (q, k, v, o; SwiGLU gate, up, down;
    LM head) plus K L 4 T^2 d for QK^T and AV; backward twice the forward."""
    from stateloop.train.flops import flops_per_sequence, peak_flops
    from support.models import tiny_config  # tests/ is on the path (pytest's pythonpath)

    T, d, f, V, L = 16, 32, 64, 97, 2
    cfg = tiny_config("vanilla_looped", K=K, n_layers=L, d_model=d, n_heads=4, head_dim=8, d_ff=f, vocab_size=V)
    forward = 2 * T * (K * L * (4 * d * d + 3 * d * f) + d * V) + K * L * 4 * T * T * d
    assert flops_per_sequence(cfg, T) == 3 * forward
    import torch

    assert peak_flops(torch.device("cpu"), "32-true") is None
    assert peak_flops(torch.device("cpu"), "32-true", configured_tflops=2.5) == 2.5e12


def test_optimizer_skips_decay_on_vectors_and_flagged_tensors():
    from stateloop.config.train import TrainConfig
    from stateloop.models.registry import build_model
    from stateloop.train.loop import configure_optimizer
    from support.models import tiny_config

    model = build_model(tiny_config("parcae"))
    opt = configure_optimizer(model, TrainConfig(micro_batch=1, global_batch=1), fused=False)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    flagged = [p for p in model.parameters() if getattr(p, "_no_weight_decay", False)]
    assert flagged and not any(id(p) in decayed for p in flagged)
    assert id(model.embed.weight) in decayed and id(model.norm_f.weight) not in decayed


@pytest.mark.parametrize("damage, pattern", [
    ("overwrite", r"train_00000\.bin: contents do not match the sha256 in meta\.json"),
    ("dtype", r"meta\.json: dtype 'float16' is not the shards' uint16"),
])
def test_damaged_shards_are_refused_in_one_line(tmp_path, capsys, damage, pattern):
    """A shard overwritten in place (same size, one token repeated) or meta.json's dtype edited to
    float16 used to train to exit 0 on garbage: the checksum is verified on first open (then
    stamped), the dtype against the vocabulary."""
    import json
    import re

    cfg = write_config(tmp_path / "cfg.yaml")
    data = write_shards(tmp_path / "data", n_train=2_000, n_val=500)
    if damage == "overwrite":
        shard = data / "train_00000.bin"
        shard.write_bytes(np.full(shard.stat().st_size // 2, 7, dtype=np.uint16).tobytes())
    else:
        meta = json.loads((data / "meta.json").read_text())
        meta["dtype"] = "float16"
        (data / "meta.json").write_text(json.dumps(meta))
    rc = main(["train", "--config", str(cfg), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
               "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(pattern, err), err
    assert not (tmp_path / "run").exists()


def test_a_verified_shard_is_not_hashed_again_until_it_changes(tmp_path, monkeypatch):
    from stateloop.data import shards as S

    data = write_shards(tmp_path / "data", n_train=2_000, n_val=500)
    calls = []
    real = S.scan_shard  # the one pass that hashes a shard and checks its ids
    monkeypatch.setattr(S, "scan_shard", lambda p, *a: calls.append(p) or real(p, *a))
    S.ShardSet(data, "train")
    S.ShardSet(data, "train")
    assert len(calls) == 1  # one shard, hashed once
    shard = data / "train_00000.bin"
    shard.write_bytes(shard.read_bytes())  # rewritten: another mtime
    S.ShardSet(data, "train")
    assert len(calls) == 2


def _change_a_token(shard) -> None:
    """Swap the shard's first two tokens (the same size, other bytes), in place."""
    tokens = np.fromfile(shard, dtype="<u2")
    assert tokens[0] != tokens[1]
    tokens[:2] = tokens[1::-1]
    with open(shard, "r+b") as fh:
        fh.write(tokens[:2].tobytes())


def test_a_shard_changed_with_its_mtime_put_back_is_read_again_and_refused(tmp_path):
    """A shard's bytes changed in place and its mtime put back (a copy tool that keeps times,
    ``touch -r``) used to pass on the stamp's size and mtime: the stamp also holds the inode's
    change time, which no tool sets back, so the next open reads the shard in full."""
    import os

    from stateloop.data import shards as S

    data = write_shards(tmp_path / "data", n_train=2_000, n_val=500)
    S.ShardSet(data, "train")  # verified and stamped
    shard = data / "train_00000.bin"
    before = shard.stat()
    _change_a_token(shard)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    while shard.stat().st_ctime_ns == before.st_ctime_ns:  # the change time's clock is coarse: let it move
        os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = shard.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    with pytest.raises(ValueError, match=r"train_00000\.bin: contents do not match the sha256 in meta\.json"):
        S.ShardSet(data, "train")


def test_verify_shards_reads_every_shard_again_whatever_its_stamp(tmp_path, capsys):
    """What no file attribute shows (bit rot below the file system: here a stamp rewritten to match
    the changed file) the stamp cannot see: a later open trusts it. `stateloop train --verify-shards`
    reads every shard in full again, against meta.json's sha256, and refuses the changed one."""
    import json

    from stateloop.data import shards as S

    cfg = write_config(tmp_path / "cfg.yaml")
    data = write_shards(tmp_path / "data", n_train=2_000, n_val=500)
    S.ShardSet(data, "train")
    shard = data / "train_00000.bin"
    _change_a_token(shard)
    recorded = json.loads((data / "meta.json").read_text())["splits"]["train"]["shards"][0]["sha256"]
    (data / S.VERIFIED / shard.name).write_text(S.stamp_key(shard, recorded, 64))  # as if the bytes rotted under it
    S.ShardSet(data, "train")  # trusted
    capsys.readouterr()
    rc = main(["train", "--config", str(cfg), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
               "--out", str(tmp_path / "run"), "--verify-shards"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{shard}: contents do not match the sha256 in meta.json" in err, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="contents do not match"):
        S.ShardSet(data, "train")  # the stamp of the refused shard is gone with the refusal
