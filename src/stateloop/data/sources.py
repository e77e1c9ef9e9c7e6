"""The source readers of the data stage (data/tokenize.py encodes what they read): the passes that
make the splits (:func:`plan_streams`), their documents in batches (:func:`text_batches`), and what
was read, for meta.json (:func:`describe_source`, :func:`split_sources`).

A source is ``synthetic``, local files (``.json``/``.parquet`` through ``datasets`` streaming;
``.jsonl`` and ``.txt`` read directly, a ``.txt`` file as one document, or one per paragraph or
line), or a hub dataset (or a local copy of one) through ``datasets.load_dataset(name, hub_config,
split=..., streaming=True)``, offline from the hub cache that ``stateloop prefetch`` fills
(data/hub.py). A few batches are held in memory at most; a document longer than
:data:`MAX_DOC_CHARS` is refused, naming its file and line.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stateloop.config import to_dict
from stateloop.config.data import LOCAL_FORMATS, DataConfig, DataError, is_local_source
from stateloop.data import hub, synthetic

BATCH_DOCS = 1024  # documents per worker task ...
BATCH_CHARS = 1 << 21  # ... or this many characters, whichever comes first
# [choice] The longest document tokenized: encoding holds ~300 bytes per token, so a 60 MB line took
# 4.9 GB. A longer one is refused, naming its line (a whole-book document stays well below this).
MAX_DOC_CHARS = 1 << 23


def _too_long(where: str, hint: str = "") -> DataError:
    return DataError(f"data.source: {where}: a document longer than {MAX_DOC_CHARS:,} characters (memory per document "
                     f"is bounded); split it{hint}")


@dataclass
class Stream:
    """One pass over part of a source. ``split`` is the output split, or None: hash-assigned."""

    kind: str  # "synthetic" | "local" | "hub" | "folder" (a local folder read like a hub repository)
    split: str | None
    files: list[str] = field(default_factory=list)  # local
    fmt: str = ""  # local: json | text | parquet
    hub_split: str = ""  # hub, folder
    n_docs: int | None = None  # synthetic: documents; others: max_docs (None: all)


def local_files(items: str | list[str], key: str = "data.source") -> tuple[list[str], str]:
    """Expand paths, folders and globs into a sorted file list of one format."""
    items = [items] if isinstance(items, str) else list(items)
    files: list[str] = []
    for item in items:
        item = os.path.expanduser(item)
        if any(ch in item for ch in "*?["):
            matches = sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"{key}: no files match {item!r}")
            files += matches
        elif os.path.isdir(item):
            matches = sorted(
                str(p) for p in Path(item).rglob("*") if p.is_file() and p.suffix in LOCAL_FORMATS and not p.name.startswith(".")
            )
            if not matches:
                hint = ""
                if any(p.is_file() and len(p.suffixes) > 1 and p.suffixes[-2] in LOCAL_FORMATS for p in Path(item).rglob("*")):
                    hint = (" (compressed files, as in a hub repository's layout: set data.data_files to read the folder "
                            "as one, e.g. {train: train/*.jsonl.zst, validation: val.jsonl.zst})")
                raise DataError(f"{key}: {item}: folder has no {'/'.join(LOCAL_FORMATS)} files{hint}")
            files += matches
        elif os.path.isfile(item):
            files.append(item)
        else:
            raise DataError(f"{key}: {item}: file not found")
    fmts = set()
    for f in files:
        suffix = Path(f).suffix
        if suffix not in LOCAL_FORMATS:
            raise DataError(f"{key}: {f}: unsupported file type {suffix or '(none)'} (use {', '.join(LOCAL_FORMATS)})")
        fmts.add(LOCAL_FORMATS[suffix])
    if len(fmts) > 1:
        raise DataError(f"{key}: files mix formats ({', '.join(sorted(fmts))}); use one kind per source")
    for f in files:
        if os.path.getsize(f) == 0:
            raise DataError(f"{key}: {f}: file is empty")
    return files, fmts.pop()


def _declares_configs(folder: str) -> bool:
    try:
        text = (Path(folder) / "README.md").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return isinstance(hub.card_front(text).get("configs"), list)


def plan_streams(cfg: DataConfig) -> list[Stream]:
    """The passes over the source that make the train / val / test splits."""
    if cfg.is_synthetic:
        s = cfg.synthetic
        return [
            Stream("synthetic", split, n_docs=n)
            for split, n in (("train", s.train_docs), ("val", s.val_docs), ("test", s.test_docs))
            if n > 0
        ]
    sources = cfg.source if isinstance(cfg.source, list) else [cfg.source]
    local = all(is_local_source(item) for item in sources)
    # read as one hub repository (load_dataset(folder, hub_config, ...)): with data_files, or one folder
    # with hub_config set or a README.md that declares ``configs:`` (as datasets reads a local card)
    one_folder = len(sources) == 1 and os.path.isdir(folder := os.path.expanduser(sources[0]))
    if local and (cfg.data_files is not None or one_folder and (cfg.hub_config is not None or _declares_configs(folder))):
        if not one_folder:
            raise DataError(f"data.data_files: needs a hub name or one local folder as data.source, got {cfg.source!r}")
        return _named_splits("folder", cfg)
    if local:
        files, fmt = local_files(cfg.source)
        streams = [Stream("local", None, files=files, fmt=fmt, n_docs=cfg.max_docs)]
        for split, extra in (("val", cfg.val_split), ("test", cfg.test_split)):
            if extra:  # for local sources, val_split / test_split name files
                f, fmt2 = local_files(extra, f"data.{split}_split")
                streams.append(Stream("local", split, files=f, fmt=fmt2))
        return streams
    if len(sources) > 1:
        raise DataError(f"data.source: a list must name local files; {sources!r} has a hub name")
    return _named_splits("hub", cfg)


def _named_splits(kind: str, cfg: DataConfig) -> list[Stream]:
    """The passes over a repository's named splits (a hub dataset or a local dataset folder): the
    train split, then val_split / test_split where given."""
    streams = [Stream(kind, None, hub_split=cfg.split, n_docs=cfg.max_docs)]
    for split, extra in (("val", cfg.val_split), ("test", cfg.test_split)):
        if extra:
            streams.append(Stream(kind, split, hub_split=extra))
    return streams


def _read_txt(path: str, unit: str) -> Iterator[str]:
    """A text file as documents: the whole file, blank-line-separated paragraphs, or lines.
    Read as written (no newline translation), so the shards decode back to the file's text."""
    with open(path, encoding="utf-8", newline="") as fh:
        if unit == "document":
            text = fh.read(MAX_DOC_CHARS + 1)
            if len(text) > MAX_DOC_CHARS:
                raise _too_long(path, " (data.text_unit: document reads the whole file as one; paragraph or line split it)")
            yield text
            return
        para: list[str] = []
        size, start = 0, 1
        for lineno, line in enumerate(iter(lambda: fh.readline(MAX_DOC_CHARS + 1), ""), 1):
            if len(line) > MAX_DOC_CHARS:  # read no further than the bound
                raise _too_long(f"{path}:{lineno}", " (one line)")
            if unit == "line":
                yield line.rstrip("\r\n")
            elif line.strip():
                start = start if para else lineno
                para.append(line)
                size += len(line)
                if size > MAX_DOC_CHARS:
                    raise _too_long(f"{path}:{start}", " (the paragraph starting there)")
            elif para:
                yield "".join(para).rstrip("\r\n")
                para, size = [], 0
        if para:
            yield "".join(para).rstrip("\r\n")


def _iter_batches_datasets(ds, text_field: str, where: str) -> Iterator[list]:
    for batch in ds.iter(batch_size=BATCH_DOCS):
        if text_field not in batch:
            raise DataError(f"data.text_field: {where} has no field {text_field!r} (has: {', '.join(batch)})")
        yield batch[text_field]


def _read_jsonl(path: str, text_field: str) -> Iterator:
    """JSON lines, read directly (faster than, and without the import cost of, ``datasets``)."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(iter(lambda: fh.readline(MAX_DOC_CHARS + 1), ""), 1):
            if len(line) > MAX_DOC_CHARS:
                raise _too_long(f"{path}:{lineno}", " (one JSON line)")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"data.source: {path}:{lineno}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or text_field not in row:
                keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
                raise DataError(f"data.text_field: {path}:{lineno} has no field {text_field!r} (has: {keys})")
            yield row[text_field]


def _raw_batches(stream: Stream, cfg: DataConfig) -> Iterator[list]:
    """Lists of raw texts (or None values) from a local or hub stream, file by file in order."""
    from itertools import islice

    if stream.kind == "local":
        for path in stream.files:
            if path.endswith(".jsonl") or stream.fmt == "text":
                rows = _read_jsonl(path, cfg.text_field) if stream.fmt == "json" else _read_txt(path, cfg.text_unit)
                try:
                    while batch := list(islice(rows, BATCH_DOCS)):
                        yield batch
                except UnicodeDecodeError as err:
                    bad = err.object[err.start : err.start + 1].hex()
                    raise DataError(f"data.source: {path}: not UTF-8 text ({err.reason}: byte 0x{bad}); "
                                    f"convert it, e.g. iconv -f latin1 -t utf-8") from None
                continue
            from datasets import load_dataset

            try:
                ds = load_dataset(stream.fmt, data_files=[path], split="train", streaming=True)
                yield from _iter_batches_datasets(ds, cfg.text_field, path)
            except DataError:
                raise
            except Exception as err:
                raise DataError(f"data.source: {path}: cannot be read as {stream.fmt} ({type(err).__name__}: {_first_line(err)})") from None
        return
    from datasets import load_dataset

    path = os.path.expanduser(cfg.source) if stream.kind == "folder" else cfg.source
    if stream.kind == "hub" and hub.offline():  # the files `stateloop prefetch` cached, read by the same call
        path = str(hub.corpus_snapshot(cfg))
    where = f"{cfg.source}" + (f" ({cfg.hub_config})" if cfg.hub_config else "") + f" split {stream.hub_split!r}"
    extra = {"data_files": cfg.data_files} if cfg.data_files is not None else {}
    try:
        ds = load_dataset(path, cfg.hub_config, split=stream.hub_split, streaming=True, **extra)
    except Exception as err:
        key = "data.source" if stream.split is None else f"data.{stream.split}_split"
        hint = ""
        if stream.split is not None and cfg.data_files is None:
            hint = "; if the source's file names do not make that split, name its files in data.data_files"
        raise DataError(f"{key}: cannot load {where} ({type(err).__name__}: {_first_line(err)}){hint}") from None
    yield from _iter_batches_datasets(ds, cfg.text_field, where)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def text_batches(stream: Stream, cfg: DataConfig) -> Iterator[list[str]]:
    """Batches of non-empty document texts from a local or hub stream, at most ``n_docs`` in all."""
    left = stream.n_docs
    buf: list[str] = []
    chars = seen = 0
    for raw in _raw_batches(stream, cfg):
        for text in raw:
            if not text:  # None or "": nothing to learn from
                continue
            if not isinstance(text, str):
                raise DataError(f"data.text_field: {cfg.text_field!r} holds {type(text).__name__} values, not text")
            seen += 1
            if len(text) > MAX_DOC_CHARS:  # a datasets or hub stream (the local readers stop at the bound)
                raise _too_long(f"{cfg.source}: document {seen} ({cfg.text_field!r})")
            buf.append(text)
            chars += len(text)
            if left is not None:
                left -= 1
            if len(buf) >= BATCH_DOCS or chars >= BATCH_CHARS or left == 0:
                yield buf
                buf, chars = [], 0
            if left == 0:
                return
    if buf:
        yield buf


def describe_source(cfg: DataConfig, streams: list[Stream]) -> dict:
    """What was read, for meta.json; for local files also their sizes and modification times
    (these enter the fingerprint, so an edited file triggers a rewrite)."""
    if cfg.is_synthetic:
        return {"kind": "synthetic", "generator": synthetic.VERSION, "seed": cfg.seed, **to_dict(cfg.synthetic)}
    out: dict = {"kind": streams[0].kind, "text_field": cfg.text_field, "max_docs": cfg.max_docs}
    if streams[0].kind in ("hub", "folder"):
        out.update(name=cfg.source, config=cfg.hub_config, split=cfg.split, val_split=cfg.val_split, test_split=cfg.test_split)
        if cfg.data_files is not None:
            out["data_files"] = cfg.data_files
        if streams[0].kind == "folder":  # every file of the folder: an edited file triggers a rewrite
            root = Path(os.path.expanduser(cfg.source))
            out["path"] = str(root.resolve())
            out["files"] = [
                {"path": str(p.relative_to(root)), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                for p in sorted(root.rglob("*"))
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
            ]
    else:
        out["format"] = streams[0].fmt
        if streams[0].fmt == "text":
            out["text_unit"] = cfg.text_unit
        for s in streams:
            out[f"{s.split or 'source'}_files"] = [
                {"path": os.path.abspath(f), "bytes": os.path.getsize(f), "mtime_ns": os.stat(f).st_mtime_ns} for f in s.files
            ]
    if any(s.split is None for s in streams):
        out["val_fraction"], out["test_fraction"] = cfg.holdout_fractions
        out["holdout_seed"] = cfg.seed
    return out


def split_sources(cfg: DataConfig, streams: list[Stream]) -> dict[str, str]:
    """Where each output split's documents come from, for meta.json's ``splits.<name>.source``:
    ``split:<name>`` (a split of a hub dataset or folder), ``files:<names>`` (local files),
    ``hash:<fraction>`` (documents of the training stream held out by content hash), or
    ``synthetic``. ``train`` is the training stream (less any hash hold-out)."""
    if cfg.is_synthetic:
        return dict.fromkeys(("train", "val", "test"), "synthetic")
    out = {}
    for stream in streams:
        if stream.kind in ("hub", "folder"):
            label = f"split:{stream.hub_split}"
        else:
            names = [os.path.basename(f) for f in stream.files]
            label = "files:" + (",".join(names) if len(names) <= 3 else f"{len(names)} files ({names[0]}, ...)")
        out[stream.split or "train"] = label
    for split, fraction in zip(("val", "test"), cfg.holdout_fractions):
        if split not in out and fraction:
            out[split] = f"hash:{fraction:g}"
    return out
