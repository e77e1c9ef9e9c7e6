"""The paper's "Pile validation data": val is the source's own validation split, read whole.

A tiny folder in the layout of the Pile's hub repository (monology/pile-uncopyrighted):
``train/00.jsonl.zst``, ``train/01.jsonl.zst``, ``val.jsonl.zst``, ``test.jsonl.zst``, JSON lines with
``text`` and ``meta`` (plain ``.jsonl`` when the ``zstandard`` package is missing), tokenized with
configs/paper.yaml's ``data:`` section, ``source`` pointed at the folder."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from stateloop.config import ConfigError
from stateloop.config.data import DataConfig, DataError
from stateloop.data import load_tokenizer
from stateloop.data.tokenize import tokenize
from stateloop.experiments import load_pipeline
from support.data import encoded, quiet, split_tokens

ROOT = Path(__file__).resolve().parents[2]
PILE = "monology/pile-uncopyrighted"


def _zstd_available() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


ZST = _zstd_available()
EXT = ".jsonl.zst" if ZST else ".jsonl"


def write_jsonl(path: Path, texts: list[str], subset: str) -> None:
    data = "".join(json.dumps({"text": t, "meta": {"pile_set_name": subset}}) + "\n" for t in texts).encode()
    if ZST:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def documents(n: int, kind: str) -> list[str]:
    """Distinct documents whose text names their split, so any leak is visible."""
    rng = np.random.default_rng(len(kind))
    words = ["loop", "state", "token", "layer", "pile", "shard", "window", "depth"]
    return [f"{kind} doc {i}: " + " ".join(rng.choice(words, size=int(rng.integers(5, 30)))) for i in range(n)]


def pile_folder(root: Path) -> tuple[Path, dict[str, list[str]]]:
    docs = {"train": documents(120, "train"), "val": documents(17, "val"), "test": documents(9, "test")}
    write_jsonl(root / "train" / f"00{EXT}", docs["train"][:70], "Pile-CC")
    write_jsonl(root / "train" / f"01{EXT}", docs["train"][70:], "ArXiv")
    write_jsonl(root / f"val{EXT}", docs["val"], "Pile-CC")
    write_jsonl(root / f"test{EXT}", docs["test"], "Pile-CC")
    return root, docs


def paper_data(scale: str = "1.4b") -> DataConfig:
    return load_pipeline(ROOT / "configs" / "paper.yaml").scales[scale].data


def local_copy_config(folder: Path, tokenizer: str = "bpe") -> DataConfig:
    """The paper's data section with only the source (and what a test can afford) changed."""
    cfg = paper_data()
    files = cfg.data_files if ZST else {k: v.replace(".jsonl.zst", ".jsonl") for k, v in cfg.data_files.items()}
    return dataclasses.replace(cfg, source=str(folder), data_files=files, tokenizer=tokenizer, vocab_size=300,
                               max_tokens=None, workers=0, shard_tokens=5_000)


def test_paper_config_takes_the_piles_own_validation_split():
    """The paper reports PPL on "Pile validation data": both scales of configs/paper.yaml read
    val whole from the Pile's validation split, and hold nothing of train out by hash."""
    for scale in ("1.4b", "410m"):
        cfg = paper_data(scale)
        assert cfg.source == PILE and cfg.split == "train" and cfg.val_split == "validation"
        assert cfg.data_files == {"train": "train/*.jsonl.zst", "validation": "val.jsonl.zst"}
        assert cfg.holdout_fractions == (0.0, 0.0) and cfg.val_fraction == 0.0
        assert cfg.val_description == "the source's own 'validation' split"
    gpu = load_pipeline(ROOT / "configs" / "gpu.yaml").scales
    (fineweb,) = [s.data for s in gpu.values() if s.data.source == "HuggingFaceFW/fineweb-edu"]
    assert fineweb.val_split is None  # one split only: held out by content hash
    assert fineweb.val_description == "0.1% of the training documents, held out by content hash"


def test_pile_layout_folder_val_shards_hold_exactly_the_validation_documents(tmp_path):
    """"Pile validation data": the val shards of a local copy of the Pile's repository hold
    exactly the tokens of val.jsonl.zst's documents, in order, and no training document; train
    holds the train/ files' documents only (no val or test document leaks into training)."""
    folder, docs = pile_folder(tmp_path / "pile")
    out = tmp_path / "out"
    meta = tokenize(local_copy_config(folder), out, progress=False, log=quiet)
    assert set(meta["splits"]) == {"train", "val"}  # no test split: the config names none
    assert split_tokens(out, "val") == encoded(out, docs["val"])
    assert split_tokens(out, "train") == encoded(out, docs["train"])
    assert meta["splits"]["val"]["documents"] == 17 and meta["splits"]["train"]["documents"] == 120
    tok = load_tokenizer(out)
    val_text = tok.decode(split_tokens(out, "val"))
    assert all(d in val_text for d in docs["val"]) and "train doc" not in val_text and "test doc" not in val_text
    # meta.json records where val came from.
    assert meta["splits"]["val"]["source"] == "split:validation"
    assert meta["splits"]["train"]["source"] == "split:train"
    assert meta["source"]["kind"] == "folder" and meta["source"]["val_split"] == "validation"
    assert {f["path"] for f in meta["source"]["files"]} == {f"train/00{EXT}", f"train/01{EXT}", f"val{EXT}", f"test{EXT}"}
    # Up to date on a rerun; an edited file of the folder makes it stale.
    assert tokenize(local_copy_config(folder), out, progress=False, log=quiet)["fingerprint"] == meta["fingerprint"]
    write_jsonl(folder / f"val{EXT}", docs["val"][:5], "Pile-CC")
    again = tokenize(local_copy_config(folder), out, progress=False, log=quiet)
    assert again["fingerprint"] != meta["fingerprint"] and again["splits"]["val"]["documents"] == 5


def test_the_hub_source_reads_the_same_layout_by_the_same_call(tmp_path, monkeypatch):
    """"Pile validation data" from the hub: the paper's source name goes to
    datasets.load_dataset with data_files and split="validation"; answered by datasets' own
    file resolution over the same layout (the hub name redirected to the local folder), the
    shards equal those of the local copy."""
    import datasets

    folder, docs = pile_folder(tmp_path / "pile")
    real = datasets.load_dataset
    calls = []

    def hub(path, name=None, **kw):
        calls.append((path, name, kw.get("split"), kw.get("data_files"), kw.get("streaming")))
        return real(str(folder) if path == PILE else path, name, **kw)

    monkeypatch.setattr(datasets, "load_dataset", hub)
    local = local_copy_config(folder)
    meta = tokenize(dataclasses.replace(local, source=PILE), tmp_path / "hub", progress=False, log=quiet)
    assert (PILE, None, "validation", local.data_files, True) in calls and (PILE, None, "train", local.data_files, True) in calls
    assert meta["source"]["kind"] == "hub" and meta["source"]["data_files"] == local.data_files
    assert meta["splits"]["val"]["source"] == "split:validation"
    tokenize(local, tmp_path / "local", progress=False, log=quiet)
    for split in ("train", "val"):
        assert split_tokens(tmp_path / "hub", split) == split_tokens(tmp_path / "local", split)
    assert split_tokens(tmp_path / "hub", "val") == encoded(tmp_path / "hub", docs["val"])

    # Without data_files, datasets sees only train/ in this layout: a one-line error names the key.
    bare = dataclasses.replace(local, source=PILE, data_files=None)
    with pytest.raises(DataError, match=r"^data\.val_split: cannot load .*split 'validation'.*data\.data_files"):
        tokenize(bare, tmp_path / "bare", progress=False, log=quiet)
    assert not (tmp_path / "bare").exists()  # checked before anything is written


def test_neox_tokens_of_tinyshakespeare_in_the_pile_layout(tmp_path, shared_data):
    """"Pile validation data" with the paper's tokenizer (GPT-NeoX-20B, shared/data): val holds
    exactly the NeoX tokens of the validation documents (tinyshakespeare paragraphs here)."""
    text = (shared_data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    paras = [p for p in text.split("\n\n") if p.strip()][:400]
    folder = tmp_path / "pile"
    write_jsonl(folder / "train" / f"00{EXT}", paras[:300], "Books")
    write_jsonl(folder / f"val{EXT}", paras[300:350], "Books")
    write_jsonl(folder / f"test{EXT}", paras[350:], "Books")
    cfg = local_copy_config(folder, tokenizer=str(shared_data / "gpt-neox-20b" / "tokenizer.json"))
    meta = tokenize(cfg, tmp_path / "out", progress=False, log=quiet)
    assert meta["eos_id"] == 0 and meta["dtype"] == "uint16"
    assert split_tokens(tmp_path / "out", "val") == encoded(tmp_path / "out", paras[300:350])
    assert split_tokens(tmp_path / "out", "train") == encoded(tmp_path / "out", paras[:300])


def test_hash_held_out_val_is_recorded_and_described(tmp_path):
    """Sources without a validation split (e.g. FineWeb-Edu) keep the content-hash hold-out;
    meta.json and the description say so, as they say "the source's own split" for the Pile."""
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in documents(400, "any")))
    cfg = DataConfig(source=str(src), vocab_size=300, val_fraction=0.05, workers=0)
    assert cfg.val_description == "5% of the training documents, held out by content hash"
    assert DataConfig(val_fraction=0.0005, source="org/corpus").val_description == \
        "0.05% of the training documents, held out by content hash"
    meta = tokenize(cfg, tmp_path / "o", progress=False, log=quiet)
    assert meta["splits"]["val"]["source"] == "hash:0.05" and meta["splits"]["train"]["source"] == "files:c.jsonl"
    val_file = tmp_path / "v.jsonl"
    val_file.write_text(json.dumps({"text": "held out"}) + "\n")
    named = dataclasses.replace(cfg, val_split=str(val_file))
    assert named.val_description == f"the held-out files {val_file}"
    assert tokenize(named, tmp_path / "n", progress=False, log=quiet)["splits"]["val"]["source"] == "files:v.jsonl"
    assert DataConfig().val_description == "500 documents of the synthetic generator's own val split"
    assert DataConfig(source="org/corpus", val_fraction=0.0).val_description == "no val split"


def test_data_files_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^data\.val_split: 'validation' is not a split of data\.data_files \(has: train\)$"):
        DataConfig(source=PILE, data_files={"train": "train/*"}, val_split="validation")
    with pytest.raises(ConfigError, match=r"^data\.split: 'train' is not a split of data\.data_files"):
        DataConfig(source=PILE, data_files={"validation": "val.jsonl.zst"})
    with pytest.raises(ConfigError, match=r"^data\.data_files: empty mapping"):
        DataConfig(source=PILE, data_files={})
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    cfg = DataConfig(source=str(tmp_path / "a.jsonl"), data_files={"train": "*.jsonl"}, vocab_size=300)
    with pytest.raises(DataError, match=r"^data\.data_files: needs a hub name or one local folder"):
        tokenize(cfg, tmp_path / "o", progress=False, log=quiet)
    if ZST:  # a folder in the Pile's layout read as plain local files: the error points to data_files
        pile_folder(tmp_path / "pile")
        with pytest.raises(DataError, match=r"folder has no .* files \(compressed files.*data\.data_files"):
            tokenize(DataConfig(source=str(tmp_path / "pile"), vocab_size=300), tmp_path / "p", progress=False, log=quiet)
