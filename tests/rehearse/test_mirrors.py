"""Local mirrors of the configs' hub datasets (stateloop.ops.rehearse.mirrors): the hub's file layout
and record schema, read by the tokenize stage with the real config's ``data:`` section (only
``source`` changed, plus the shared tokenizer file and workers=0) through the same
``datasets.load_dataset`` call as the hub name."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from stateloop.config.data import DataConfig, DataError
from stateloop.data.sources import plan_streams
from stateloop.data.tokenize import holdout_key, holdout_split, tokenize
from stateloop.experiments import load_pipeline
from stateloop.ops.rehearse.mirrors import FINEWEB_COLUMNS, MIRRORS, write_mirror
from support.data import encoded, quiet, split_tokens

ROOT = Path(__file__).resolve().parents[2]
PILE = "monology/pile-uncopyrighted"
FINEWEB = "HuggingFaceFW/fineweb-edu"
PILE_SUBSETS = {"Pile-CC", "Wikipedia (en)", "Gutenberg (PG-19)"}  # the ones a mirror writes
FINEWEB_DTYPES = {"text": "string", "id": "string", "dump": "string", "url": "string", "file_path": "string",
                  "language": "string", "language_score": "double", "token_count": "int64", "score": "double",
                  "int_score": "int64"}


def real_data(config: str, scale: str) -> DataConfig:
    return load_pipeline(ROOT / "configs" / config).scales[scale].data


def rehearsal_data(cfg: DataConfig, overrides: dict, shared_data: Path) -> DataConfig:
    """The real data section with the mirror's overrides and what a test can afford."""
    return dataclasses.replace(cfg, **overrides, tokenizer=str(shared_data / "gpt-neox-20b" / "tokenizer.json"), workers=0)


def pile_lines(path: Path) -> list[dict]:
    import zstandard

    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()).decode("utf-8")
    return [json.loads(line) for line in raw.splitlines()]


def parquet_rows(folder: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return [row for f in sorted((folder / "sample" / "10BT").glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


def files_of(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def load_calls(monkeypatch):
    """Records datasets.load_dataset's arguments; a hub name is answered from its mirror folder
    (``redirect``), as the hub would answer it from the repository."""
    import datasets

    real = datasets.load_dataset
    calls: list[tuple] = []
    redirect: dict[str, str] = {}

    def record(path, name=None, **kw):
        calls.append((path, name, tuple(sorted(kw.items(), key=lambda kv: kv[0]))))
        return real(redirect.get(path, path), name, **kw)

    monkeypatch.setattr(datasets, "load_dataset", record)
    return calls, redirect


def same_calls_but_path(hub_calls: list[tuple], local_calls: list[tuple], hub: str, folder: str) -> bool:
    return [(folder if p == hub else p, n, kw) for p, n, kw in hub_calls] == local_calls


# ----------------------------------------------------------------------------------------------
# The Pile (configs/paper.yaml)


def test_pile_mirror_has_the_hub_layout_and_record_schema(tmp_path, shared_data):
    import yaml

    cfg = real_data("paper.yaml", "1.4b")
    overrides = write_mirror(cfg, tmp_path, shared_data)
    assert set(overrides) == {"source"}  # data_files, split names: as the config has them
    folder = Path(overrides["source"])
    assert folder.parent == tmp_path and folder.name.startswith("monology--pile-uncopyrighted-")
    assert files_of(folder) == {f"train/{k:02d}.jsonl.zst" for k in range(30)} | {"val.jsonl.zst", "test.jsonl.zst", "README.md"}
    card = yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])
    assert "configs" not in card  # no configs: datasets infers a train split only, as from the hub
    docs = {}
    for name in ("train", "val", "test"):
        files = sorted(folder.glob("train/*.jsonl.zst")) if name == "train" else [folder / f"{name}.jsonl.zst"]
        rows = [row for f in files for row in pile_lines(f)]
        for row in rows:
            assert set(row) == {"text", "meta"} and set(row["meta"]) == {"pile_set_name"}
            assert row["meta"]["pile_set_name"] in PILE_SUBSETS and isinstance(row["text"], str) and row["text"]
        docs[name] = [row["text"] for row in rows]
    assert {k: len(v) for k, v in docs.items()} == {"train": 240, "val": 24, "test": 24}
    assert len(set(docs["train"]) | set(docs["val"]) | set(docs["test"])) == 288  # distinct, no doc in two splits
    assert 150_000 < sum(map(len, docs["train"])) < 600_000  # a few hundred KB of text
    # The paper's data_files patterns select exactly the mirror's train and val files.
    assert cfg.data_files == {"train": "train/*.jsonl.zst", "validation": "val.jsonl.zst"}


@pytest.mark.slow
def test_pile_mirror_tokenizes_with_the_paper_config_by_the_hubs_call(tmp_path, shared_data, load_calls):
    """val = exactly val.jsonl.zst's documents, train = the train/ files' documents, in order;
    the call for the mirror folder equals the call for the hub name but for the path."""
    calls, redirect = load_calls
    real = real_data("paper.yaml", "1.4b")
    overrides = write_mirror(real, tmp_path / "hub-data", shared_data)
    folder = overrides["source"]
    cfg = rehearsal_data(real, overrides, shared_data)
    out = tmp_path / "local"
    meta = tokenize(cfg, out, progress=False, log=quiet)
    local_calls = list(calls)
    assert {(n, dict(kw)["split"]) for _, n, kw in local_calls} == {(None, "train"), (None, "validation")}
    assert all(p == folder and dict(kw)["data_files"] == real.data_files and dict(kw)["streaming"] is True
               for p, _, kw in local_calls)
    assert set(meta["splits"]) == {"train", "val"} and meta["source"]["kind"] == "folder"
    assert meta["splits"]["val"]["source"] == "split:validation" and meta["splits"]["train"]["source"] == "split:train"
    val_docs = [r["text"] for r in pile_lines(Path(folder) / "val.jsonl.zst")]
    train_docs = [r["text"] for f in sorted(Path(folder).glob("train/*.jsonl.zst")) for r in pile_lines(f)]
    assert split_tokens(out, "val") == encoded(out, val_docs)
    assert split_tokens(out, "train") == encoded(out, train_docs)
    assert meta["splits"]["val"]["documents"] == 24 and meta["splits"]["train"]["documents"] == 240
    # Enough for a few steps of 2 x 2 x 33 tokens and a handful of 33-token val windows.
    assert meta["splits"]["train"]["tokens"] > 50 * 132 and meta["splits"]["val"]["tokens"] > 20 * 33

    # The hub name, answered from the same folder: the same calls but for the path, the same shards.
    calls.clear()
    redirect[PILE] = folder
    hub_meta = tokenize(dataclasses.replace(cfg, source=PILE), tmp_path / "hub", progress=False, log=quiet)
    assert same_calls_but_path(calls, local_calls, PILE, folder)
    assert hub_meta["source"]["kind"] == "hub"
    for split in ("train", "val"):
        assert split_tokens(tmp_path / "hub", split) == split_tokens(out, split)


# ----------------------------------------------------------------------------------------------
# FineWeb-Edu (configs/gpu.yaml)


def test_fineweb_mirror_has_the_hub_layout_and_columns(tmp_path, shared_data):
    import pyarrow.parquet as pq
    import yaml

    cfg = real_data("gpu.yaml", "gpu")
    overrides = write_mirror(cfg, tmp_path, shared_data)
    assert set(overrides) == {"source"}  # hub_config, split: as the config has them
    folder = Path(overrides["source"])
    assert folder.parent == tmp_path and folder.name.startswith("HuggingFaceFW--fineweb-edu-")
    assert files_of(folder) == {"README.md", "sample/10BT/000_00000.parquet", "sample/10BT/001_00000.parquet"}
    card = (folder / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["configs"] == [{"config_name": "sample-10BT", "data_files": [{"split": "train", "path": "sample/10BT/*"}]}]
    for f in sorted(folder.glob("sample/10BT/*.parquet")):
        schema = pq.read_schema(f)
        assert [(n, str(schema.field(n).type)) for n in schema.names] == list(FINEWEB_DTYPES.items())
    assert [n for n, _ in FINEWEB_COLUMNS] == list(FINEWEB_DTYPES)
    rows = parquet_rows(folder)
    assert len(rows) == 288 and len({r["text"] for r in rows}) == 288 and len({r["id"] for r in rows}) == 288
    for r in rows:
        assert re.fullmatch(r"<urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}>", r["id"])
        assert r["dump"] == "CC-MAIN-2024-10" and r["language"] == "en" and r["url"].startswith("https://example.org/")
        assert r["file_path"].startswith("s3://commoncrawl/crawl-data/CC-MAIN-2024-10/") and r["file_path"].endswith(".warc.gz")
        assert r["token_count"] == len(r["text"].split()) and 0.0 < r["language_score"] <= 1.0
        assert 2.5 <= r["score"] < 4.5 and r["int_score"] == int(r["score"] + 0.5) >= 3


@pytest.mark.slow
def test_fineweb_mirror_tokenizes_with_the_gpu_config_by_the_hubs_call(tmp_path, shared_data, load_calls):
    """The gpu config's hub_config reads the folder by load_dataset(folder, "sample-10BT",
    split="train", streaming=True), as the hub name; val and test are held out by content hash
    at the config's own fractions (0.1%), and the mirror's documents give 24 of each."""
    calls, redirect = load_calls
    real = real_data("gpu.yaml", "gpu")
    assert real.hub_config == "sample-10BT" and real.val_split is None and real.data_files is None
    overrides = write_mirror(real, tmp_path / "hub-data", shared_data)
    folder = overrides["source"]
    cfg = rehearsal_data(real, overrides, shared_data)
    out = tmp_path / "local"
    meta = tokenize(cfg, out, progress=False, log=quiet)
    local_calls = list(calls)
    assert local_calls and set(local_calls) == {(folder, "sample-10BT", (("split", "train"), ("streaming", True)))}
    assert meta["source"]["kind"] == "folder" and meta["source"]["config"] == "sample-10BT"
    assert {s: e["source"] for s, e in meta["splits"].items()} == {"train": "split:train", "val": "hash:0.001",
                                                                    "test": "hash:0.001"}
    texts = [r["text"] for r in parquet_rows(Path(folder))]
    key = holdout_key(cfg.seed)
    expected = {s: [t for t in texts if holdout_split(t, cfg.holdout_fractions, key) == s] for s in ("train", "val", "test")}
    assert {s: len(v) for s, v in expected.items()} == {"train": 240, "val": 24, "test": 24}
    for split, docs in expected.items():
        assert meta["splits"][split]["documents"] == len(docs)
        assert split_tokens(out, split) == encoded(out, docs)
    assert meta["splits"]["train"]["tokens"] > 50 * 132 and meta["splits"]["val"]["tokens"] > 20 * 33

    calls.clear()
    redirect[FINEWEB] = folder
    hub_meta = tokenize(dataclasses.replace(cfg, source=FINEWEB), tmp_path / "hub", progress=False, log=quiet)
    assert same_calls_but_path(calls, local_calls, FINEWEB, folder)
    assert hub_meta["source"]["kind"] == "hub"
    for split in ("train", "val", "test"):
        assert split_tokens(tmp_path / "hub", split) == split_tokens(out, split)


def test_a_folder_is_read_as_a_repository_with_hub_config_or_a_card_that_declares_configs(tmp_path, shared_data):
    """data/sources.py: one local folder goes through load_dataset(folder, hub_config, ...) when the
    config sets hub_config, or the folder's README.md declares configs; else it is local files."""
    real = real_data("gpu.yaml", "gpu")
    folder = Path(write_mirror(real, tmp_path, shared_data)["source"])
    assert plan_streams(dataclasses.replace(real, source=str(folder)))[0].kind == "folder"
    assert plan_streams(dataclasses.replace(real, source=str(folder), hub_config=None))[0].kind == "folder"  # the card
    (folder / "README.md").unlink()
    assert plan_streams(dataclasses.replace(real, source=str(folder)))[0].kind == "folder"  # hub_config
    assert plan_streams(dataclasses.replace(real, source=str(folder), hub_config=None))[0].kind == "local"


# ----------------------------------------------------------------------------------------------
# Writing


@pytest.mark.slow
def test_rewriting_is_a_no_op_and_the_content_is_deterministic(tmp_path, shared_data):
    for config, scale in (("paper.yaml", "1.4b"), ("gpu.yaml", "gpu")):
        cfg = real_data(config, scale)
        folder = Path(write_mirror(cfg, tmp_path / "a", shared_data)["source"])
        before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}
        write_mirror(cfg, tmp_path / "a", shared_data)  # nothing rewritten: mtimes (and fingerprints) stay
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} == before
        other = Path(write_mirror(cfg, tmp_path / "b", shared_data)["source"])  # byte-identical elsewhere
        assert {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()} == \
            {p.relative_to(folder): b for p, (b, _) in before.items()}
        # A damaged file is rewritten and a stray one removed; hidden files are left alone.
        victim = sorted(before)[0]
        victim.write_bytes(b"damaged")
        (folder / "stray.parquet").write_bytes(b"x")
        (folder / ".keep").write_bytes(b"")
        write_mirror(cfg, tmp_path / "a", shared_data)
        assert victim.read_bytes() == before[victim][0]
        assert not (folder / "stray.parquet").exists() and (folder / ".keep").exists()
    # Another held-out hash (seed) makes other FineWeb content: its own folder, the first kept.
    variant = Path(write_mirror(dataclasses.replace(cfg, seed=1), tmp_path / "a", shared_data)["source"])
    assert variant != folder and variant.parent == folder.parent
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".keep"} == \
        {p: b for p, (b, _) in before.items()}


def test_smaller_mirrors_and_the_synthetic_text(tmp_path):
    """Without the shared text the synthetic generator's paragraphs fill the same layout."""
    cfg = real_data("paper.yaml", "410m")
    folder = Path(write_mirror(cfg, tmp_path, None, n_train_docs=12, n_val_docs=3, n_test_docs=0)["source"])
    assert files_of(folder) == {f"train/{k:02d}.jsonl.zst" for k in range(12)} | {"val.jsonl.zst", "README.md"}
    rows = pile_lines(folder / "val.jsonl.zst")
    assert len(rows) == 3 and all(r["meta"] == {"pile_set_name": "Pile-CC"} for r in rows)
    assert "Question:" in rows[0]["text"]


def test_errors_are_one_line_and_name_the_dataset(tmp_path, shared_data):
    with pytest.raises(DataError, match=r"^data\.source: 'org/unknown' has no local mirror .*known: .*pile-uncopyrighted") as err:
        write_mirror(DataConfig(source="org/unknown"), tmp_path, shared_data)
    assert "\n" not in str(err.value)
    gpu = real_data("gpu.yaml", "gpu")
    with pytest.raises(DataError, match=r"^data\.hub_config: 'nope' is not a config of the HuggingFaceFW/fineweb-edu mirror"):
        write_mirror(dataclasses.replace(gpu, hub_config="nope"), tmp_path, shared_data)
    with pytest.raises(DataError, match=r"tinyshakespeare/input\.txt: missing"):
        write_mirror(gpu, tmp_path, tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"^monology/pile-uncopyrighted mirror: the source text gives only \d+ "
                                        r"of the 100048 train/val/test documents"):
        write_mirror(real_data("paper.yaml", "1.4b"), tmp_path, shared_data, n_train_docs=100_000)
    assert set(MIRRORS) == {PILE, FINEWEB}
    assert not any(tmp_path.iterdir())  # nothing written on an error


def test_a_local_source_is_rehearsed_from_where_the_config_is_run(tmp_path, monkeypatch):
    """configs/decide.yaml reads ../shared/data/tinyshakespeare/input.txt relative to the
    repository root; its rehearsal folder lies elsewhere, so the path becomes absolute."""
    import yaml

    from stateloop.ops.rehearse.run import prepare

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    cfg = yaml.safe_load(prepare("configs/decide.yaml", tmp_path / "r", tmp_path).read_text())
    for scale in cfg["scales"].values():
        source = Path(scale["data"]["source"])
        assert source.is_absolute() and source == (root / "../shared/data/tinyshakespeare/input.txt").resolve()
        assert scale["data"]["max_docs"] == 400 and scale["paper"] is False
