"""`stateloop tokenize`: reproducible shards, round trips through real tokenizers, parallel
workers equal to one, atomic writes under interruption, and one-line errors."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stateloop.cli import main as cli
from stateloop.config import ConfigError
from stateloop.config.data import DataConfig, SyntheticConfig
from stateloop.data import load_tokenizer, synthetic
from stateloop.data.shards import ShardSet, read_meta
from stateloop.data.tokenize import is_complete, tokenize
from support.data import quiet

ROOT = Path(__file__).resolve().parents[2]
NEOX_SHA = "56ac4821e129d2c520fdaba60abd920fa852ada51b45c0dd52bbb6bd8c985ade"  # shared/data/gpt-neox-20b/SOURCE.md


def synth_cfg(**kw) -> DataConfig:
    base = dict(vocab_size=512, shard_tokens=20000, workers=0,
                synthetic=SyntheticConfig(train_docs=300, val_docs=30, test_docs=20))
    base.update(kw)
    return DataConfig(**base)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def tok_ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


def write_jsonl(path: Path, texts, field="text") -> Path:
    with open(path, "w") as fh:
        for t in texts:
            fh.write(json.dumps({field: t, "n": 1}) + "\n")
    return path


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    tokenize(synth_cfg(), out, progress=False, log=quiet)
    return out


# ----------------------------------------------------------------------------------------------


def test_same_input_twice_gives_identical_shards(synth_dir, tmp_path):
    tokenize(synth_cfg(), tmp_path, progress=False, log=quiet)
    assert shard_bytes(tmp_path) == shard_bytes(synth_dir) and len(shard_bytes(tmp_path)) >= 3
    assert (tmp_path / "tokenizer.json").read_bytes() == (synth_dir / "tokenizer.json").read_bytes()
    assert read_meta(tmp_path) == read_meta(synth_dir)


def test_synthetic_bpe_shards_decode_to_the_generated_documents(synth_dir):
    meta = read_meta(synth_dir)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] <= 512
    assert meta["tokenizer"]["sha256"] == hashlib.sha256((synth_dir / "tokenizer.json").read_bytes()).hexdigest()
    for shard in meta["splits"]["train"]["shards"]:
        assert shard["sha256"] == hashlib.sha256((synth_dir / shard["file"]).read_bytes()).hexdigest()
    tok = load_tokenizer(synth_dir)
    assert tok.get_vocab_size() == meta["vocab_size"] and meta["eos_token"] == "<|endoftext|>"
    for split, n in (("train", 300), ("val", 30), ("test", 20)):
        shards = ShardSet(synth_dir, split)
        ids = shards.window(0, len(shards))
        assert meta["splits"][split]["documents"] == n and meta["splits"][split]["tokens"] == len(ids)
        ends = np.flatnonzero(ids == shards.eos_id)
        assert len(ends) == n and ends[-1] == len(ids) - 1
        docs = [tok.decode(d.tolist()) for d in np.split(ids, ends + 1)[:-1]]
        assert docs == [d for d in synthetic.iter_documents(split, n)]
        # the BPE learned merges: well under one token per character
        assert len(ids) < 0.5 * sum(map(len, docs))


def test_rerun_is_a_noop_and_a_changed_input_rewrites(tmp_path):
    logs = []
    cfg = synth_cfg(synthetic=SyntheticConfig(train_docs=50, val_docs=5, test_docs=0))
    tokenize(cfg, tmp_path, progress=False, log=quiet)
    stamp = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    tokenize(dataclasses.replace(cfg, workers=1), tmp_path, progress=False, log=logs.append)
    assert "up to date" in logs[-1]
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamp
    tokenize(dataclasses.replace(cfg, seed=1), tmp_path, progress=False, log=logs.append)
    assert "up to date" not in logs[-1]
    assert read_meta(tmp_path)["data_config"]["seed"] == 1 and "test" not in read_meta(tmp_path)["splits"]
    assert not (tmp_path / ".partial").exists()


@pytest.mark.slow
def test_neox_tokenizer_round_trips_tinyshakespeare(shared_data, tmp_path):
    text_path = shared_data / "tinyshakespeare" / "input.txt"
    tok_path = shared_data / "gpt-neox-20b" / "tokenizer.json"
    cfg = DataConfig(source=str(text_path), tokenizer=str(tok_path), val_fraction=0.0, workers=0, shard_tokens=100_000)
    meta = tokenize(cfg, tmp_path, model_vocab_size=50432, progress=False, log=quiet)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 50277 and meta["eos_id"] == 0
    assert meta["tokenizer"]["sha256"] == NEOX_SHA  # the file is copied byte for byte
    assert len(meta["splits"]["train"]["shards"]) == 4 and list(meta["splits"]) == ["train"]
    shards = ShardSet(tmp_path, "train")
    ids = shards.window(0, len(shards))
    assert ids[-1] == 0 and (ids == 0).sum() == 1  # one document, one end-of-document token
    text = text_path.read_text()
    tok = load_tokenizer(tmp_path)
    assert tok.decode(ids[:-1].tolist()) == text
    # the same ids as the tokenizer gives when called directly
    from tokenizers import Tokenizer

    assert ids[:-1].tolist() == Tokenizer.from_file(str(tok_path)).encode(text).ids


def test_two_workers_equal_one_bitwise(tmp_path):
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta <|endoftext|> épsilon zeta 42 7 ~".split()
    texts = [" ".join(rng.choice(words, size=rng.integers(1, 60))) for _ in range(3000)]
    src = write_jsonl(tmp_path / "c.jsonl", texts)
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        cfg = DataConfig(source=str(src), vocab_size=300, val_fraction=0.1, test_fraction=0.05, workers=workers,
                         shard_tokens=7000)
        tokenize(cfg, out, progress=False, log=quiet)
        outs.append(out)
    assert shard_bytes(outs[0]) == shard_bytes(outs[1]) and len(shard_bytes(outs[0])) > 3
    m1, m2 = read_meta(outs[0]), read_meta(outs[1])
    assert m1["splits"] == m2["splits"] and m1["fingerprint"] == m2["fingerprint"]
    # Independent reference: held-out split from keyed BLAKE2b as documented, then encode + eos.
    tok = load_tokenizer(outs[0])
    assert tok.encode_special_tokens  # load_tokenizer encodes as the data was encoded
    want = {"train": [], "val": [], "test": []}
    for t in texts:
        u = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8, key=(0).to_bytes(8, "little")).digest(), "little") / 2**64
        split = "val" if u < 0.1 else "test" if u < 0.15 else "train"
        want[split] += tok_ids(tok, t) + [m1["eos_id"]]
    for split, ids in want.items():
        shards = ShardSet(outs[0], split)
        assert shards.window(0, len(shards)).tolist() == ids
    assert 0.07 < m1["splits"]["val"]["documents"] / 3000 < 0.13
    # "<|endoftext|>" inside a text is text: the only eos ids are the document ends
    train = ShardSet(outs[0], "train")
    assert (train.window(0, len(train)) == m1["eos_id"]).sum() == m1["splits"]["train"]["documents"]


def test_duplicates_share_a_split_and_local_heldout_files(tmp_path):
    texts = [f"document number {i % 50}" for i in range(400)]  # every text 8 times
    src = write_jsonl(tmp_path / "dup.jsonl", texts)
    val = write_jsonl(tmp_path / "val.jsonl", ["held out one", "held out two"])
    cfg = DataConfig(source=str(src), vocab_size=300, val_fraction=0.3, test_fraction=0.3, seed=5)
    meta = tokenize(cfg, tmp_path / "a", progress=False, log=quiet)
    assert all(meta["splits"][s]["documents"] % 8 == 0 for s in meta["splits"])
    assert set(meta["splits"]) == {"train", "val", "test"}
    meta = tokenize(dataclasses.replace(cfg, val_split=str(val)), tmp_path / "b", progress=False, log=quiet)
    assert meta["splits"]["val"]["documents"] == 2


def test_text_units_and_uint32_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(70000)}}
    big = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    big.save(str(tmp_path / "big.json"))
    (tmp_path / "t.txt").write_text("w69999 w1\nw2\n\nw3 w4\n\n\nw5\n")
    expect = {"document": [[70001, 3, 4, 5, 6, 7]], "paragraph": [[70001, 3, 4], [5, 6], [7]],
              "line": [[70001, 3], [4], [5, 6], [7]]}
    for unit, docs in expect.items():
        cfg = DataConfig(source=str(tmp_path / "t.txt"), tokenizer=str(tmp_path / "big.json"), text_unit=unit, val_fraction=0.0)
        meta = tokenize(cfg, tmp_path / unit, progress=False, log=quiet)
        assert meta["dtype"] == "uint32" and (tmp_path / unit / "train_00000.bin").stat().st_size % 4 == 0
        shards = ShardSet(tmp_path / unit, "train")
        assert shards.window(0, len(shards)).tolist() == [i for d in docs for i in d + [0]]


# ----------------------------------------------------------------------------------------------
# Interrupted runs


def test_interrupted_run_leaves_no_complete_looking_shard(tmp_path, monkeypatch, synth_dir):
    import stateloop.data.shards as shards_mod

    out = tmp_path / "d"
    tokenize(synth_cfg(synthetic=SyntheticConfig(train_docs=20, val_docs=5, test_docs=0)), out, progress=False, log=quiet)
    assert is_complete(out)
    calls = {"n": 0}
    real_add = shards_mod.ShardWriter.add

    def failing_add(self, tokens):
        calls["n"] += 1
        if calls["n"] == 2:  # the first batch finished several shards inside .partial/
            raise KeyboardInterrupt
        return real_add(self, tokens)

    monkeypatch.setattr(shards_mod.ShardWriter, "add", failing_add)
    cfg = synth_cfg(shard_tokens=3000)
    with pytest.raises(KeyboardInterrupt):
        tokenize(cfg, out, progress=False, log=quiet)
    assert list((out / ".partial").glob("train_*.bin")), "the test should interrupt after finished shards"
    assert not (out / "meta.json").exists() and not list(out.glob("*.bin")) and not is_complete(out)
    with pytest.raises(FileNotFoundError, match="run `stateloop tokenize` first"):
        ShardSet(out, "train")
    monkeypatch.setattr(shards_mod.ShardWriter, "add", real_add)
    tokenize(synth_cfg(), out, progress=False, log=quiet)  # the rerun rewrites cleanly
    assert shard_bytes(out) == shard_bytes(synth_dir) and not (out / ".partial").exists()


def test_sigkill_mid_run_leaves_no_complete_looking_shard(tmp_path):
    out = tmp_path / "d"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "stateloop.cli", "tokenize", "--out", str(out), "--no-progress", "--set",
           "data.synthetic={train_docs: 100000, val_docs: 10, test_docs: 10}", "data.vocab_size=300", "data.bpe_docs=100",
           "data.shard_tokens=5000", "data.workers=0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600  # a hang guard: the command imports, trains its BPE, then writes shards
    try:
        while not list((out / ".partial").glob("train_00001.bin")):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.time() < deadline, "no shard finished within 600 s"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (out / "meta.json").exists() and not list(out.glob("*.bin")) and not is_complete(out)


# ----------------------------------------------------------------------------------------------
# Errors: one line, naming the key or file


def test_errors_name_the_key_or_file(tmp_path, shared_data):
    def err(cfg, **kw):
        with pytest.raises(ConfigError) as info:
            tokenize(cfg, tmp_path / "out", progress=False, log=quiet, **kw)
        msg = str(info.value)
        assert "\n" not in msg
        return msg

    assert "data.source: " in err(DataConfig(source=str(tmp_path / "none.jsonl"))) and "file not found" in err(
        DataConfig(source=str(tmp_path / "none.jsonl")))
    (tmp_path / "empty.jsonl").write_text("")
    assert "empty.jsonl: file is empty" in err(DataConfig(source=str(tmp_path / "empty.jsonl")))
    write_jsonl(tmp_path / "blank.jsonl", ["", ""])
    assert "no documents with text" in err(DataConfig(source=str(tmp_path / "blank.jsonl")))
    write_jsonl(tmp_path / "body.jsonl", ["a b c"], field="body")
    assert "data.text_field: " in err(DataConfig(source=str(tmp_path / "body.jsonl"))) and "(has: body, n)" in err(
        DataConfig(source=str(tmp_path / "body.jsonl")))
    assert "no files match" in err(DataConfig(source=str(tmp_path / "*.parquet")))
    neox = str(shared_data / "gpt-neox-20b" / "tokenizer.json")
    msg = err(DataConfig(source=str(tmp_path / "body.jsonl"), text_field="body", tokenizer=neox), model_vocab_size=1000)
    assert msg.startswith("model.vocab_size: 1000 is smaller") and "50277" in msg
    assert "data.vocab_size: 4096" in err(synth_cfg(vocab_size=4096), model_vocab_size=1000)
    assert "data.tokenizer: " in err(DataConfig(source=str(tmp_path / "body.jsonl"), tokenizer=str(tmp_path / "no.json")))
    assert "data.eos_token: '<eos>'" in err(synth_cfg(eos_token="<eos>", tokenizer=neox))
    assert not (tmp_path / "out").exists()  # nothing was written by a failing run
    with pytest.raises(ConfigError, match=r"data.val_fraction: must be < 1\.0, got 1\.5"):
        DataConfig(val_fraction=1.5)


def test_cli_with_config_scale_and_errors(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "scales:\n"
        "  small:\n"
        "    model: {vocab_size: 300}\n"
        "    data: {vocab_size: 512, synthetic: {train_docs: 20, val_docs: 2, test_docs: 0}}\n"
    )
    rc = cli(["tokenize", "--config", str(cfg), "--scale", "small", "--out", str(tmp_path / "o"), "--no-progress"])
    assert rc == 2
    assert capsys.readouterr().err.strip() == (
        "stateloop tokenize: error: model.vocab_size: 300 is smaller than the tokenizer's vocabulary "
        "(data.vocab_size: 512 ids); raise model.vocab_size or lower data.vocab_size")
    rc = cli(["tokenize", "--config", str(cfg), "--scale", "small", "--out", str(tmp_path / "o"), "--no-progress",
              "--set", "data.vocab_size=300", "data.workers=0"])
    assert rc == 0 and read_meta(tmp_path / "o")["splits"]["train"]["documents"] == 20
    cfg.write_text("scales:\n  small:\n    data: {vocab_sise: 512}\n")
    assert cli(["tokenize", "--config", str(cfg), "--scale", "small", "--out", str(tmp_path / "p")]) == 2
    assert "scales.small.data.vocab_sise: unknown key" in capsys.readouterr().err
    cfg.write_text("scales:\n  small:\n    data: {synthetic: {max_hops: 9}}\n")
    assert cli(["tokenize", "--config", str(cfg), "--scale", "small", "--out", str(tmp_path / "p")]) == 2
    assert "scales.small.data.synthetic.max_hops: must be <= 7, got 9" in capsys.readouterr().err


def test_hub_source_offline_fails_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "stateloop.cli", "tokenize", "--out", str(tmp_path / "o"), "--set",
                        "data.source=EleutherAI/pile", "data.hub_config=all", "data.split=train", "data.vocab_size=300"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stateloop tokenize: error: offline (HF_HUB_OFFLINE=1), and not in the caches")
    assert "dataset EleutherAI/pile: not in the hub cache; run `stateloop prefetch --config CONFIG`" in lines[0]
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------------------------
# Sources read through `datasets`: local .json/.parquet, and the hub path (load_dataset stubbed
# with local files, since no hub is reachable here)


def test_json_and_parquet_through_datasets_match_jsonl(tmp_path):
    import pandas as pd

    texts = [f"row {i}: " + "lorem ipsum " * (i % 5) for i in range(200)] + [""]
    write_jsonl(tmp_path / "a.jsonl", texts)
    (tmp_path / "a.json").write_text(json.dumps([{"text": t} for t in texts]))
    pd.DataFrame({"text": texts, "k": range(len(texts))}).to_parquet(tmp_path / "a.parquet")
    tok = str(tmp_path / "tok.json")
    # one tokenizer for all three: a BPE trained once, then used as a local file
    tokenize(DataConfig(source=str(tmp_path / "a.jsonl"), vocab_size=300), tmp_path / "ref", progress=False, log=quiet)
    (tmp_path / "ref" / "tokenizer.json").rename(tok)
    results = {}
    for ext in ("jsonl", "json", "parquet"):
        cfg = DataConfig(source=str(tmp_path / f"a.{ext}"), tokenizer=tok, val_fraction=0.1)
        meta = tokenize(cfg, tmp_path / ext, progress=False, log=quiet)
        assert meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] == 200  # "" skipped
        results[ext] = shard_bytes(tmp_path / ext)
    assert results["jsonl"] == results["json"] == results["parquet"]


def test_hub_source_path_with_val_split(tmp_path, monkeypatch):
    import datasets

    files = {"train": write_jsonl(tmp_path / "tr.jsonl", [f"train doc {i}" for i in range(100)]),
             "validation": write_jsonl(tmp_path / "va.jsonl", [f"val doc {i}" for i in range(7)])}
    calls = []
    real = datasets.load_dataset

    def fake_load_dataset(name, config=None, split=None, streaming=False, **kw):
        calls.append((name, config, split, streaming))
        return real("json", data_files=[str(files[split])], split="train", streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    cfg = DataConfig(source="someorg/corpus", hub_config="en", split="train", val_split="validation", vocab_size=300,
                     max_docs=60)
    meta = tokenize(cfg, tmp_path / "o", progress=False, log=quiet)
    assert ("someorg/corpus", "en", "validation", True) in calls and ("someorg/corpus", "en", "train", True) in calls
    assert meta["splits"]["train"]["documents"] == 60 and meta["splits"]["val"]["documents"] == 7
    assert meta["source"] == {"kind": "hub", "text_field": "text", "max_docs": 60, "name": "someorg/corpus", "config": "en",
                              "split": "train", "val_split": "validation", "test_split": None,
                              "val_fraction": 0.0, "test_fraction": 0.0, "holdout_seed": 0}
    tok = load_tokenizer(tmp_path / "o")
    val = ShardSet(tmp_path / "o", "val")
    assert tok.decode(val.window(0, len(val)).tolist()) == "".join(f"val doc {i}" for i in range(7))


def test_max_tokens_cuts_after_the_batch_that_reaches_it(tmp_path, monkeypatch):
    import stateloop.data.sources as sources

    monkeypatch.setattr(sources, "BATCH_DOCS", 10)
    src = write_jsonl(tmp_path / "c.jsonl", [f"doc {i} " + "word " * 20 for i in range(200)])
    full = tokenize(DataConfig(source=str(src), vocab_size=300, val_fraction=0.0), tmp_path / "full", progress=False, log=quiet)
    per_doc = full["splits"]["train"]["tokens"] / 200
    cfg = DataConfig(source=str(src), tokenizer=str(tmp_path / "full" / "tokenizer.json"), val_fraction=0.0, max_tokens=1000)
    meta = tokenize(cfg, tmp_path / "cut", progress=False, log=quiet)
    n = meta["splits"]["train"]["documents"]
    assert n % 10 == 0 and 1000 <= meta["splits"]["train"]["tokens"] < 1000 + 10 * per_doc + 10
    train = ShardSet(tmp_path / "full", "train")
    cut = ShardSet(tmp_path / "cut", "train")
    assert cut.window(0, len(cut)).tolist() == train.window(0, len(cut)).tolist()  # a prefix of the full run
