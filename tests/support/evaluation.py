"""Fixtures for the evaluation tests: a small byte-level BPE tokenizer trained on generated
sentences, token shards of a held-out split, and run folders of tiny models."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from support.models import tiny_config

WORDS = ("the a one cat dog bird fox sat ran saw jumped over under on in near mat house tree hill "
         "big small red blue green quick brown lazy old young and then it was is").split()
EOS = "<|endoftext|>"
MODEL_VOCAB = 320  # >= the tokenizer's ids


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(n)]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """tokenizer.json (byte-level BPE, eos <|endoftext|>, trained on generated sentences and
    synthetic-corpus documents), meta.json and a `val` split of shards."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from stateloop.data.shards import ShardWriter, token_dtype, write_meta
    from stateloop.data.synthetic import iter_documents

    folder = tmp_path_factory.mktemp("data")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(sentences(2000, seed=0) + list(iter_documents("train", 300)), trainer)
    assert tok.get_vocab_size() <= MODEL_VOCAB
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    dtype = token_dtype(tok.get_vocab_size())
    writer = ShardWriter(folder, "val", dtype, shard_tokens=1500)  # several shards: windows cross boundaries
    for text in sentences(100, seed=1) + list(iter_documents("val", 20)):
        writer.add(tok.encode(text).ids + [eos])
    write_meta(folder, {"dtype": dtype.name, "vocab_size": tok.get_vocab_size(), "eos_id": eos,
                        "tokenizer": {"file": "tokenizer.json"}, "splits": {"val": writer.close()},
                        "source": {"kind": "synthetic", "generator": "v1", "seed": 0, "max_hops": 3}})
    return folder


@pytest.fixture(scope="session")
def tokenizer(data_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(data_dir / "tokenizer.json"))


def save_run(run_dir: Path, data_dir: Path, name: str = "vanilla_looped", model=None, config_model=None, **overrides):
    """A run folder holding a tiny model (random weights) with the resolved config that training
    would save. ``config_model`` replaces the saved model section (to make a mismatch)."""
    from stateloop.config import to_dict
    from stateloop.models.registry import build_model
    from stateloop.runs import save_final

    cfg = tiny_config(name, **{"vocab_size": MODEL_VOCAB, "max_seq_len": 64, **overrides})
    model = model if model is not None else build_model(cfg).eval()
    config = {"run": {"id": f"test/{name}/K{cfg.K}_ds{cfg.d_s}_seed1234", "scale": "test"},
              "model": config_model if config_model is not None else to_dict(cfg), "data": {"dir": str(data_dir)}}
    save_final(run_dir, model, config)
    return model, config


@pytest.fixture
def make_run(tmp_path, data_dir):
    def make(name: str = "vanilla_looped", **overrides):
        run_dir = tmp_path / "runs" / name
        model, _ = save_run(run_dir, data_dir, name, **overrides)
        return run_dir, model

    return make


@pytest.fixture(scope="session")
def mlflow_dir(tmp_path_factory):
    """One MLflow store for the session (creating its tables takes seconds)."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path, mlflow_dir):
    """Nothing may come from the Hub; MLflow writes into the session's store. huggingface_hub and
    datasets read HF_HUB_OFFLINE once, when first imported: they are imported before the variable
    is set and their copies set for this test only, so that a later test in the process does not
    find the Hub offline because an evaluation test happened to import them first."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_dir / 'mlflow.db'}")
    monkeypatch.chdir(mlflow_dir)  # MLflow's artifact folder (./mlruns) lands there


