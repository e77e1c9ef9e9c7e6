"""Fixtures for the training tests: token shards written with ShardWriter from a generated,
learnable token stream, and a tiny pipeline config file around them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from stateloop.data.shards import ShardWriter, token_dtype, write_meta

ROOT = Path(__file__).resolve().parents[2]
# Seconds a test waits for a training subprocess to reach a point (its imports, MLflow's store, a
# checkpoint): about 10 CPU-seconds here, so only a hang guard; generous for a slow or loaded machine
# (scripts/test.sh runs two pytest processes and the rehearsals' jobs side by side).
SUBPROCESS_WAIT_S = 600.0
VOCAB = 64  # tokenizer ids; the model's vocab_size (96) is larger, as a padded vocabulary is
EOS = 0


def counting_stream(n_tokens: int, seed: int, vocab: int = VOCAB) -> np.ndarray:
    """Documents that count upward by a per-document stride: a, a+s, a+2s, ... (mod vocab - 1, then
    + 1 to skip the EOS id), each 8..40 tokens long and ended by EOS. After the first two tokens of
    a document every token is determined by the previous two, so a model can learn it."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    total = 0
    while total < n_tokens:
        length = int(rng.integers(8, 41))
        start, stride = int(rng.integers(0, vocab - 1)), int(rng.integers(1, 4))
        doc = (start + stride * np.arange(length)) % (vocab - 1) + 1
        out.append(np.append(doc, EOS))
        total += length + 1
    return np.concatenate(out)[:n_tokens]


def write_shards(folder: Path, n_train: int = 60_000, n_val: int = 4_000, seed: int = 0, vocab: int = VOCAB,
                 shard_tokens: int = 25_000) -> Path:
    dtype = token_dtype(vocab)
    splits = {}
    for i, (split, n) in enumerate((("train", n_train), ("val", n_val))):
        writer = ShardWriter(folder, split, dtype, shard_tokens=shard_tokens)
        writer.add(counting_stream(n, seed + 1000 * i, vocab))
        splits[split] = writer.close()
    write_meta(folder, {"dtype": dtype.name, "vocab_size": vocab, "eos_id": EOS,
                        "tokenizer": {"kind": "test-counting"}, "splits": splits})
    return folder


TINY_MODEL = dict(vocab_size=96, n_layers=1, d_model=32, d_ff=64, n_heads=2, head_dim=16, max_seq_len=64,
                  mixer_heads=2, mixer_head_dim=16, attn_impl="torch", ssd_impl="torch")
TINY_TRAIN = dict(accelerator="cpu", devices=1, precision="32-true", seq_len=32, micro_batch=4, global_batch=8,
                  lr=3e-3, min_lr=3e-4, warmup_steps=3, max_steps=12, val_every=6, val_tokens=512,
                  checkpoint_every=4, keep_checkpoints=2, log_every=2, seed=7, mlflow_experiment="tests")


def write_config(path: Path, model: dict | None = None, train: dict | None = None) -> Path:
    cfg = {"scales": {"t": {"model": {**TINY_MODEL, **(model or {})}, "train": {**TINY_TRAIN, **(train or {})}}},
           "experiments": {"e": {"scale": "t", "models": ["vanilla_looped", "stateloop"], "K": [2, 3], "d_s": [32],
                                 "seeds": [1234, 7]}}}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory) -> str:
    """One sqlite store for the session (creating its tables takes seconds)."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    return f"sqlite:///{db}"


@pytest.fixture
def tiny_setup(tmp_path, mlflow_uri, monkeypatch):
    """(config path, data dir) of a tiny run; MLflow logs to the session store."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    data = write_shards(tmp_path / "data")
    return write_config(tmp_path / "cfg.yaml"), data


def resolved(cfg_path: Path, data: Path, run: str = "t/stateloop/K2_ds32_seed1234", overrides: list[str] | None = None) -> dict:
    from stateloop.resolve import resolve_run

    return resolve_run(cfg_path, run, overrides or [], data).as_dict()


def weights(run_dir: Path) -> dict:
    from stateloop.runs import read_weights

    return read_weights(run_dir)[1]["model"]


def assert_bitwise_equal(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key].contiguous().flatten(), b[key].contiguous().flatten()
        assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{key} differs"


def cli(args: list[str], cwd: Path, env_extra: dict | None = None, **popen) -> subprocess.Popen:
    """``python -m stateloop.cli ...`` in a subprocess (src/ on the path)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "stateloop.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.fixture(scope="session")
def synthetic_shards(tmp_path_factory) -> Path:
    """The project's synthetic corpus (stateloop.data.synthetic), tokenized with a 512-id BPE."""
    from stateloop.config.data import DataConfig, SyntheticConfig
    from stateloop.data.tokenize import tokenize

    out = tmp_path_factory.mktemp("synthetic")
    cfg = DataConfig(vocab_size=512, shard_tokens=1 << 20, workers=0,
                     synthetic=SyntheticConfig(train_docs=600, val_docs=40, test_docs=10))
    tokenize(cfg, out, progress=False, log=lambda *a, **k: None)
    return out
