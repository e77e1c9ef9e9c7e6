"""The tokenize job on a cluster: it stamps the shards it writes as verified (a training's ranks do
not each read them again), sizes its tokenizer threads from the job's allocation, and an
interrupted run continues after its last complete shard instead of starting again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import stateloop.data.shards as shards_mod
import stateloop.data.tokenize as tok_mod
from stateloop.config.data import DataConfig, SyntheticConfig
from stateloop.data.shards import ShardSet
from stateloop.data.synthetic import document
from stateloop.data.tokenize import tokenize
from support.data import quiet


def _corpus(path: Path, n: int = 3000) -> Path:
    """Short documents, hash-split into train, val and test (every batch feeds all three)."""
    cfg = SyntheticConfig()
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"text": document("train", i, 5, cfg)[:300]}) + "\n")
    return path


def _cfg(source: Path) -> DataConfig:
    return DataConfig(source=str(source), vocab_size=300, bpe_docs=300, shard_tokens=4000, workers=0,
                      val_fraction=0.1, test_fraction=0.05)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))} | {"tokenizer.json": (out / "tokenizer.json").read_bytes()}


def test_the_tokenizer_stamps_its_shards_so_training_reads_none_again(tmp_path, monkeypatch):
    out = tmp_path / "d"
    tokenize(DataConfig(vocab_size=300, shard_tokens=5000, workers=0,
                        synthetic=SyntheticConfig(train_docs=300, val_docs=30, test_docs=0)), out, progress=False, log=quiet)
    scans = []
    real_scan = shards_mod.scan_shard
    monkeypatch.setattr(shards_mod, "scan_shard", lambda *a, **k: scans.append(a[0]) or real_scan(*a, **k))
    for rank in range(2):  # two ranks of a training open both splits
        for split in ("train", "val"):
            ShardSet(out, split)
    assert scans == [] and len(list((out / ".verified").iterdir())) == len(list(out.glob("*.bin"))) > 2
    shard = sorted(out.glob("train_*.bin"))[1]
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))  # the stamp no longer vouches for it: read, and refused
    with pytest.raises(ValueError, match="contents do not match the sha256"):
        ShardSet(out, "train")
    assert scans == [shard]


def test_tokenizer_threads_come_from_the_jobs_allocation_not_the_nodes_cores(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(tok_mod.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # the job's 4 CPUs
    monkeypatch.setattr(tok_mod.os, "cpu_count", lambda: 64)  # of a 64-core node
    started = {}

    class Ctx:
        def Pool(self, n, initializer, initargs):  # noqa: N802 - multiprocessing's name
            started.update(n=n, threads=initargs[0])
            return None

    monkeypatch.setattr(multiprocessing, "get_context", lambda method: Ctx())
    tok_mod._Runner(2, 0, None)
    assert started == {"n": 2, "threads": 2}
    assert tok_mod.worker_threads(8) == 1 and tok_mod.usable_cpus() == 4


@pytest.mark.parametrize("affinity,slurm,workers,expect,warned", [
    ({0}, None, 2, 1, "its CPU affinity"),  # taskset -c 0: two workers would share one CPU
    (set(range(64)), "1", 32, 1, "SLURM_CPUS_PER_TASK=1"),  # task/none: the whole node's affinity, 1 CPU given
    (set(range(64)), "8", 4, 4, None),  # fewer than given: as configured, no word
    ({0, 1}, "8", 0, 0, None),  # 0: encode in this process
])
def test_encoding_processes_follow_the_allocation_not_data_workers(monkeypatch, affinity, slurm, workers, expect, warned):
    """Issue 53: "The tokenizer's worker processes come from data.workers (32), not from the
    allocation: under taskset -c 0 two workers shared one CPU without a word; on task/none clusters
    affinity is the whole node while SLURM_CPUS_PER_TASK says 1. Take the smaller of the two and warn
    when the config asks for more." """
    monkeypatch.setattr(tok_mod.os, "sched_getaffinity", lambda pid: affinity)
    if slurm is None:
        monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    else:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", slurm)
    said = []
    assert tok_mod.encoding_workers(workers, warn=said.append) == expect
    if warned is None:
        assert said == []
    else:
        (line,) = said
        assert "data.workers" in line and str(workers) in line and warned in line and "\n" not in line, line


def test_tokenize_starts_no_more_encoding_processes_than_the_job_has_cpus(tmp_path, monkeypatch, capsys):
    """End to end: data.workers 3 under one allowed CPU encodes with one process and says so once."""
    import multiprocessing

    monkeypatch.setattr(tok_mod.os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    started = []
    real = multiprocessing.get_context

    class Ctx:
        def Pool(self, n, initializer, initargs):  # noqa: N802 - multiprocessing's name
            started.append(n)
            return real("spawn").Pool(n, initializer, initargs)

    monkeypatch.setattr(multiprocessing, "get_context", lambda method: Ctx())
    source = _corpus(tmp_path / "c.jsonl", n=300)
    tokenize(dataclasses.replace(_cfg(source), workers=3), tmp_path / "d", progress=False, log=quiet)
    assert started and set(started) == {1}, started
    err = capsys.readouterr().err
    assert err.count("data.workers: 3") == 1, err


@pytest.mark.slow
def test_an_interrupted_tokenization_continues_after_its_last_complete_shard(tmp_path, monkeypatch):
    """Interrupted while a batch is being written (its train tokens added, the held-out ones not):
    the rerun keeps the shards complete at the last record, cuts the open one back, encodes only
    the batches after the record, and ends with the same files as a run never interrupted."""
    source = _corpus(tmp_path / "c.jsonl")
    encoded = []
    real_encode = tok_mod._encode
    monkeypatch.setattr(tok_mod, "_encode", lambda texts: encoded.append(len(texts)) or real_encode(texts))
    reference = tmp_path / "ref"
    tokenize(_cfg(source), reference, progress=False, log=quiet)
    full = len(encoded)
    assert full > 6, full

    out = tmp_path / "d"
    calls = {"n": 0}
    real_add = shards_mod.ShardWriter.add

    def add(self, tokens):
        calls["n"] += 1
        if calls["n"] == 8 and self.split != "train":  # the third batch: train written, val not
            raise KeyboardInterrupt
        return real_add(self, tokens)

    monkeypatch.setattr(shards_mod.ShardWriter, "add", add)
    with pytest.raises(KeyboardInterrupt):
        tokenize(_cfg(source), out, progress=False, log=quiet)
    assert (out / ".partial/resume.json").is_file() and not (out / "meta.json").exists()
    monkeypatch.setattr(shards_mod.ShardWriter, "add", real_add)

    encoded.clear()
    said = []
    tokenize(_cfg(source), out, progress=False, log=said.append)
    assert any("resuming an interrupted tokenization after its last complete shard" in s for s in said), said
    assert 0 < len(encoded) < full  # only the batches after the record were encoded again
    assert _files(out) == _files(reference)
    meta, ref = json.loads((out / "meta.json").read_text()), json.loads((reference / "meta.json").read_text())
    assert meta["splits"] == ref["splits"] and meta["fingerprint"] == ref["fingerprint"]
    assert not (out / ".partial").exists()


def test_which_scales_train_on_another_scales_tokens():
    """A scale reads another's folder where its own tokens would be that folder's start (same source,
    tokenizer, order; a budget at most the other's; no hold-out that moves with the budget) and its
    model's vocabulary is as large: configs/paper.yaml's 410M reads its 1.4B's."""
    from stateloop.data.stage import data_homes
    from stateloop.experiments import load_pipeline

    root = Path(__file__).resolve().parents[2]
    paper = load_pipeline(root / "configs/paper.yaml")
    assert data_homes(paper.scales, ["1.4b", "410m"]) == {"1.4b": "1.4b", "410m": "1.4b"}
    scales = dict(paper.scales)
    import dataclasses

    def variant(**data):
        return dataclasses.replace(scales["410m"], data=dataclasses.replace(scales["410m"].data, **data))

    for changed in ({"tokenizer": "gpt2"}, {"split": "validation"}, {"seed": 1}, {"shard_tokens": 1 << 20},
                    {"max_tokens": 31_000_000_000}):  # another tokenizer, split, order, sharding; a larger budget
        assert data_homes({**scales, "410m": variant(**changed)}, ["1.4b", "410m"])["410m"] == "410m", changed
    held_out = {"val_split": None, "val_fraction": 0.001}  # val held out by hash grows with the budget
    both = {"1.4b": dataclasses.replace(scales["1.4b"], data=dataclasses.replace(scales["1.4b"].data, **held_out)),
            "410m": variant(**held_out)}
    assert data_homes(both, ["1.4b", "410m"])["410m"] == "410m"
    small_vocab = dataclasses.replace(scales["410m"], model=dataclasses.replace(scales["410m"].model, vocab_size=50304))
    assert data_homes({**scales, "410m": small_vocab}, ["1.4b", "410m"])["410m"] == "410m"
