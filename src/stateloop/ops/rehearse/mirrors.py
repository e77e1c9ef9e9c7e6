"""Local folders in a hub dataset's file layout and record schema, for rehearsals offline.

A rehearsal reads a config's hub dataset from a small local folder laid out as the hub repository
is, through the same ``datasets.load_dataset`` call (data/sources.py): only ``data.source`` changes,
so ``data_files``, split names, ``hub_config`` and held-out fractions are exercised as they are.
:data:`MIRRORS`: ``monology/pile-uncopyrighted`` (zstd JSON lines, a README declaring no configs,
as the repository's) and ``HuggingFaceFW/fineweb-edu`` (parquet with the dataset's ten columns per
``hub_config``; its one split is held out by hash, so the mirror picks documents that fall in val
and test under the config's own hash). Documents come from the shared text (Tiny Shakespeare,
WikiText-2's validation articles) or the synthetic generator; WikiText-2's test and LAMBADA are
left out on purpose (a rehearsal evaluates on them). Writing is idempotent: a folder named by the
files' digest, each file written only when its bytes differ (the tokenize stage's fingerprint
covers mtimes).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stateloop.config.data import DataConfig, DataError, SyntheticConfig
from stateloop.data import synthetic
from stateloop.data.synthetic import document
from stateloop.data.tokenize import holdout_key, holdout_split
from stateloop.files import atomic_write_bytes

MIRROR_VERSION = 1  # in every README: bump when the same arguments would give other files
PILE = "monology/pile-uncopyrighted"
FINEWEB_EDU = "HuggingFaceFW/fineweb-edu"
PILE_TRAIN_FILES = 30  # train/00.jsonl.zst .. train/29.jsonl.zst, as in the hub repository
FINEWEB_FILES = 2  # NNN_00000.parquet files of the mirror (the hub has more per config)
FINEWEB_DUMP = "CC-MAIN-2024-10"
FINEWEB_COLUMNS = (("text", "string"), ("id", "string"), ("dump", "string"), ("url", "string"),
                   ("file_path", "string"), ("language", "string"), ("language_score", "float64"),
                   ("token_count", "int64"), ("score", "float64"), ("int_score", "int64"))
SHAKESPEARE = "tinyshakespeare/input.txt"
WIKITEXT = "wikitext-2/valid.txt"  # not test.txt: the rehearsal's wikitext task evaluates on it
SYNTHETIC_DOCS = 6000  # synthetic documents cut into paragraphs when there is no shared text


# ----------------------------------------------------------------------------------------------
# The document pool: windows of consecutive units (speeches, paragraphs) of each source text


@dataclass
class _Source:
    key: str  # short name, used in URLs
    subset: str  # the Pile's meta.pile_set_name
    units: list[str]
    groups: list[int]  # a document's units share one group (a WikiText article)
    titles: list[str] | None  # per group: the article title that opens each document
    lengths: tuple[int, int]  # units per document, inclusive

    def text(self, a: int, b: int) -> str:
        body = "\n\n".join(self.units[a:b])
        return f"{self.titles[self.groups[a]]}\n\n{body}" if self.titles is not None else body

    def length(self, a: int) -> int:
        lo, hi = self.lengths
        h = int.from_bytes(hashlib.blake2b(f"{self.key}:{a}".encode(), digest_size=4).digest(), "little")
        return lo + h % (hi - lo + 1)

    def end(self, a: int, n: int) -> int:
        """End of the window of ``n`` units from ``a``, cut at the end of ``a``'s group."""
        b = a + 1
        while b < min(len(self.units), a + n) and self.groups[b] == self.groups[a]:
            b += 1
        return b


@dataclass
class _Doc:
    text: str
    source: _Source
    span: tuple[int, int]

    @property
    def slug(self) -> str:
        return f"{self.source.key}/{self.span[0]:05d}-{self.span[1]:05d}"


def _read(shared_data: Path, rel: str) -> str:
    path = Path(shared_data) / rel
    if not path.is_file():
        raise DataError(f"{path}: missing (shared text for the dataset mirrors)")
    return path.read_text(encoding="utf-8")


def _shakespeare(text: str) -> _Source:
    units = [u.strip("\n") for u in text.split("\n\n") if u.strip()]
    return _Source("shakespeare", "Gutenberg (PG-19)", units, [0] * len(units), None, (3, 12))


def _wikipedia(text: str) -> _Source:
    title_re = re.compile(r"^ = ([^=].*?) = $")
    units, groups, titles = [], [], []
    for line in text.split("\n"):
        if m := title_re.match(line):
            titles.append(m.group(1).strip())
        elif titles and line.strip() and not line.startswith(" = "):  # skip section headings
            units.append(line.strip())
            groups.append(len(titles) - 1)
    return _Source("wikipedia", "Wikipedia (en)", units, groups, titles, (1, 3))


def _synthetic() -> _Source:
    cfg = SyntheticConfig()
    units = [p.strip("\n") for i in range(SYNTHETIC_DOCS) for p in document("train", i, 0, cfg).split("\n\n") if p.strip()]
    return _Source("synthetic", "Pile-CC", units, [0] * len(units), None, (1, 3))


def _sources(shared_data: Path | None) -> list[_Source]:
    if shared_data is None:
        return [_synthetic()]
    return [_shakespeare(_read(shared_data, SHAKESPEARE)), _wikipedia(_read(shared_data, WIKITEXT))]


def _provenance(shared_data: Path | None) -> list[str]:
    if shared_data is None:
        return [f"  - the synthetic generator ({synthetic.VERSION}, seed 0), {SYNTHETIC_DOCS} documents cut into paragraphs"]
    lines = []
    for rel in (SHAKESPEARE, WIKITEXT):
        digest = hashlib.sha256((Path(shared_data) / rel).read_bytes()).hexdigest()
        lines.append(f"  - `{rel}` (sha256 `{digest}`)")
    return lines


class _Cursor:
    """Consecutive, non-overlapping documents of each source, taken in turn across sources."""

    def __init__(self, sources: list[_Source]):
        self.sources = sources
        self.pos = [0] * len(sources)

    def __iter__(self) -> Iterator[_Doc]:
        turn = 0
        while any(p < len(s.units) for p, s in zip(self.pos, self.sources)):
            i = turn % len(self.sources)
            turn += 1
            src, a = self.sources[i], self.pos[i]
            if a >= len(src.units):
                continue
            b = src.end(a, src.length(a))
            self.pos[i] = b
            yield _Doc(src.text(a, b), src, (a, b))


def _too_few(name: str, what: str, got: int, wanted: int) -> DataError:
    return DataError(f"{name} mirror: the source text gives only {got} of the {wanted} {what} documents asked for; ask for fewer")


def _sequential(sources: list[_Source], counts: list[int], name: str) -> list[list[_Doc]]:
    """Consecutive documents: the first counts[0] in one list, the next counts[1] in the next, ..."""
    docs = iter(_Cursor(sources))
    out = []
    for n in counts:
        got = [doc for _, doc in zip(range(n), docs)]
        if len(got) < n:
            raise _too_few(name, "train/val/test", sum(map(len, out)) + len(got), sum(counts))
        out.append(got)
    return out


# ----------------------------------------------------------------------------------------------
# The Pile: train/NN.jsonl.zst, val.jsonl.zst, test.jsonl.zst


def _jsonl_zst(docs: list[_Doc]) -> bytes:
    import zstandard

    lines = "".join(json.dumps({"text": d.text, "meta": {"pile_set_name": d.source.subset}}) + "\n" for d in docs)
    return zstandard.ZstdCompressor(level=3).compress(lines.encode("utf-8"))


def pile_files(data_cfg: DataConfig, shared_data: Path | None, n_train: int, n_val: int, n_test: int) -> dict[str, bytes]:
    """The files of the Pile's mirror: relative path -> bytes."""
    train, val, test = _sequential(_sources(shared_data), [n_train, n_val, n_test], PILE)
    n_files = min(PILE_TRAIN_FILES, n_train)
    files = {f"train/{k:02d}.jsonl.zst": _jsonl_zst(train[k * n_train // n_files:(k + 1) * n_train // n_files])
             for k in range(n_files)}
    if val:
        files["val.jsonl.zst"] = _jsonl_zst(val)
    if test:
        files["test.jsonl.zst"] = _jsonl_zst(test)
    subsets = sorted({d.source.subset for d in train + val + test})
    readme = [  # a card without configs: datasets infers a train split only, as for the hub's
        "---",
        "pretty_name: The Pile, uncopyrighted subsets (local mirror)",
        "language:",
        "- en",
        "---",
        "",
        f"# {PILE} (local mirror)",
        "",
        f"Written by `stateloop.ops.rehearse.mirrors` (version {MIRROR_VERSION}) for offline rehearsals: the hub",
        "repository's file layout and record schema (zstd-compressed JSON lines with `text` and",
        "`meta.pile_set_name`), with a few hundred documents instead of the Pile's.",
        "",
        f"- `train/`: {n_train} documents in {n_files} files; `val.jsonl.zst`: {n_val}; `test.jsonl.zst`: {n_test}",
        f"- subsets: {', '.join(subsets)}",
        "- documents cut from:",
        *_provenance(shared_data),
        "",
    ]
    files["README.md"] = "\n".join(readme).encode("utf-8")
    return files


# ----------------------------------------------------------------------------------------------
# FineWeb-Edu: parquet files of one config, declared in README.md's front matter


def _fineweb_config(hub_config: str | None) -> tuple[str, str, str, str]:
    """(config name, its data_files pattern, the folder the mirror writes, dump)."""
    name = hub_config or "default"
    if name == "default":
        return name, "data/*/*", f"data/{FINEWEB_DUMP}", FINEWEB_DUMP
    if m := re.fullmatch(r"sample-(\d+BT)", name):
        return name, f"sample/{m.group(1)}/*", f"sample/{m.group(1)}", FINEWEB_DUMP
    if re.fullmatch(r"CC-MAIN-\d{4}-\d{2}", name):
        return name, f"data/{name}/*", f"data/{name}", name
    raise DataError(f"data.hub_config: {name!r} is not a config of the {FINEWEB_EDU} mirror "
                    f"(known: default, sample-NNBT, CC-MAIN-YYYY-NN)")


def _unit(text: str, salt: str) -> float:
    """A number in [0, 1) from a hash of the text (plausible per-document scores)."""
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=8, person=salt.encode()[:16]).digest()
    return int.from_bytes(h, "little") / 2.0**64


def _fineweb_rows(docs: list[_Doc], dump: str) -> dict[str, list]:
    cols: dict[str, list] = {name: [] for name, _ in FINEWEB_COLUMNS}
    for doc in docs:
        digest = hashlib.blake2b(doc.text.encode("utf-8"), digest_size=16).digest()
        score = round(2.75 + 1.5 * _unit(doc.text, "score"), 6)  # the edu filter keeps int_score >= 3
        segment = int(_unit(doc.text, "segment") * 1000)
        cols["text"].append(doc.text)
        cols["id"].append(f"<urn:uuid:{uuid.UUID(bytes=digest, version=4)}>")
        cols["dump"].append(dump)
        cols["url"].append(f"https://example.org/{doc.slug}")
        cols["file_path"].append(f"s3://commoncrawl/crawl-data/{dump}/segments/1707947474001.{segment % 100}/warc/"
                                 f"CC-MAIN-20240220000000-20240220030000-{segment:05d}.warc.gz")
        cols["language"].append("en")
        cols["language_score"].append(round(0.85 + 0.14 * _unit(doc.text, "language"), 6))
        cols["token_count"].append(len(doc.text.split()))
        cols["score"].append(score)
        cols["int_score"].append(int(score + 0.5))
    return cols


def _parquet(docs: list[_Doc], dump: str) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(name, getattr(pa, dtype)()) for name, dtype in FINEWEB_COLUMNS])
    table = pa.table(_fineweb_rows(docs, dump), schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue()


def _held_out_search(sources: list[_Source], start: list[int], want: dict[str, int], assign) -> dict[str, list[_Doc]]:
    """Disjoint windows of the sources, in turn, whose content hash puts them in each split of ``want``."""
    found: dict[str, list[_Doc]] = {s: [] for s in want}
    used: list[set[int]] = [set() for _ in sources]
    offset = 0
    while any(len(found[s]) < n for s, n in want.items()):
        live = False
        for i, src in enumerate(sources):
            a = start[i] + offset
            if a >= len(src.units):
                continue
            live = True
            if a in used[i]:
                continue
            lo, hi = src.lengths
            for n in range(lo, hi + 1):
                b = src.end(a, n)
                if b - a < n and n > lo:  # cut at the group's end: the same window as a shorter n
                    break
                if used[i].intersection(range(a, b)):
                    break
                doc = _Doc(src.text(a, b), src, (a, b))
                split = assign(doc.text)
                if split in found and len(found[split]) < want[split]:
                    found[split].append(doc)
                    used[i].update(range(a, b))
                    break
        if not live:
            break
        offset += 1
    return found


def fineweb_edu_files(data_cfg: DataConfig, shared_data: Path | None, n_train: int, n_val: int,
                      n_test: int) -> dict[str, bytes]:
    """The files of FineWeb-Edu's mirror: relative path -> bytes; n_train, n_val and n_test documents
    fall in each split under the config's content hash (none where the fraction is 0)."""
    config, pattern, folder, dump = _fineweb_config(data_cfg.hub_config)
    fractions, key = data_cfg.holdout_fractions, holdout_key(data_cfg.seed)
    want = {"train": n_train, "val": n_val if fractions[0] else 0, "test": n_test if fractions[1] else 0}
    assign = lambda text: holdout_split(text, fractions, key)  # noqa: E731
    sources = _sources(shared_data)
    cursor = _Cursor(sources)
    got: dict[str, list[_Doc]] = {s: [] for s in want}
    for doc in cursor:  # consecutive documents: train (and any held-out one that comes by)
        split = assign(doc.text)
        if len(got[split]) < want[split]:
            got[split].append(doc)
        if len(got["train"]) == want["train"]:
            break
    if len(got["train"]) < want["train"]:
        raise _too_few(FINEWEB_EDU, "train", len(got["train"]), want["train"])
    missing = {s: want[s] - len(got[s]) for s in ("val", "test") if len(got[s]) < want[s]}
    if missing:  # the rest of the text, every window, for documents that hash to val / test
        more = _held_out_search(sources, cursor.pos, missing, assign)
        for s, docs in more.items():
            if len(docs) < missing[s]:
                raise _too_few(FINEWEB_EDU, f"{s} (hash-held-out)", want[s] - missing[s] + len(docs), want[s])
            got[s] += docs
    # One stream, held-out documents spread evenly among the training ones.
    held = got["val"] + got["test"]
    held.sort(key=lambda d: (d.source.key, d.span))
    order = [((j + 0.5) / len(got["train"]), 0, j, d) for j, d in enumerate(got["train"])]
    order += [((k + 0.5) / len(held), 1, k, d) for k, d in enumerate(held)]
    stream = [d for *_, d in sorted(order, key=lambda t: t[:3])]
    n_files = min(FINEWEB_FILES, len(stream))
    files = {f"{folder}/{k:03d}_00000.parquet": _parquet(stream[k * len(stream) // n_files:(k + 1) * len(stream) // n_files], dump)
             for k in range(n_files)}
    front = [
        "---",
        "license: odc-by",
        "task_categories:",
        "- text-generation",
        "language:",
        "- en",
        f"pretty_name: FineWeb-Edu ({config}, local mirror)",
        "configs:",
        f"- config_name: {config}",
        "  data_files:",
        "  - split: train",
        f"    path: {pattern}",
        "---",
    ]
    body = [
        "",
        f"# {FINEWEB_EDU} (local mirror)",
        "",
        f"Written by `stateloop.ops.rehearse.mirrors` (version {MIRROR_VERSION}) for offline rehearsals: the hub",
        f"repository's layout for the config `{config}` (parquet files under `{folder}/`, declared in this",
        "card's `configs:`) and its ten columns, with a few hundred documents instead of billions of tokens.",
        "",
        f"- {len(stream)} documents in {n_files} files, one `train` split",
        f"- held out by the tokenize stage's content hash (seed {data_cfg.seed}, val_fraction {fractions[0]:g}, "
        f"test_fraction {fractions[1]:g}): {len(got['val'])} val and {len(got['test'])} test documents (chosen",
        "  so that the hash puts them there: far more than the fractions would give at this size)",
        "- columns other than `text` are made up: ids from a hash of the text, `https://example.org/...` URLs,",
        "  `token_count` counts whitespace-separated words, scores drawn from a hash",
        "- documents cut from:",
        *_provenance(shared_data),
        "",
    ]
    files["README.md"] = "\n".join(front + body).encode("utf-8")
    return files


# ----------------------------------------------------------------------------------------------
# Writing a mirror

MIRRORS: dict[str, Callable[..., dict[str, bytes]]] = {
    PILE: pile_files,
    FINEWEB_EDU: fineweb_edu_files,
}


def mirror_folder(out_dir: Path, name: str, files: dict[str, bytes]) -> Path:
    """``<org>--<name>-<digest of the files>``: one folder per content, so differing mirrors never clash."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(f"{rel}\0{hashlib.sha256(files[rel]).hexdigest()}\n".encode())
    return Path(out_dir) / f"{name.replace('/', '--')}-{digest.hexdigest()[:10]}"


def _sync(folder: Path, files: dict[str, bytes]) -> None:
    """Make ``folder`` hold exactly ``files`` (hidden files aside), writing only what differs."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = folder / rel
        try:
            same = path.stat().st_size == len(data) and path.read_bytes() == data
        except FileNotFoundError:
            same = False
        if not same:
            atomic_write_bytes(path, data)
    for path in sorted(folder.rglob("*"), reverse=True):  # children before their folders
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and rel.as_posix() not in files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def write_mirror(data_cfg: DataConfig, out_dir: Path, shared_data: Path | None, n_train_docs: int = 240,
                 n_val_docs: int = 24, n_test_docs: int | None = None) -> dict:
    """Write the local mirror of ``data_cfg.source`` (a hub name in :data:`MIRRORS`) under
    ``out_dir`` and return the overrides of the config's ``data:`` section that read it:
    ``{"source": <folder>}``. ``n_test_docs`` defaults to ``n_val_docs``; :class:`DataError` for a
    hub name without a mirror, or more documents than the shared text gives."""
    name = data_cfg.source
    if not isinstance(name, str) or name not in MIRRORS:
        raise DataError(f"data.source: {name!r} has no local mirror for a rehearsal (known: {', '.join(MIRRORS)})")
    n_test_docs = n_val_docs if n_test_docs is None else n_test_docs
    if n_train_docs <= 0 or n_val_docs < 0 or n_test_docs < 0:
        raise DataError(f"{name} mirror: document counts must be positive (train) and >= 0 (val, test)")
    files = MIRRORS[name](data_cfg, Path(shared_data) if shared_data is not None else None,
                          n_train_docs, n_val_docs, n_test_docs)
    folder = mirror_folder(out_dir, name, files)
    _sync(folder, files)
    return {"source": str(folder)}
