"""Flat token shards read by memory map: the format between tokenization and training.

    DATA_DIR/
        meta.json          {"format": 1, "dtype": "uint16", "vocab_size": V, "eos_id": e,
                            "tokenizer": {...}, "splits": {"train": {"tokens": N,
                            "shards": [{"file": "train_00000.bin", "tokens": n, "sha256": ...}]}}}
        tokenizer.json     the tokenizer that made the tokens (evaluation decodes with it)
        train_00000.bin    raw little-endian token ids, documents separated by eos_id
        val_00000.bin ...

Shards are written to a temporary name and renamed when complete; meta.json is written last,
so a folder with a meta.json is complete, and an interrupted run leaves no shard that looks
complete. Readers never load a split into memory: :class:`ShardSet` maps the files and reads
any window of consecutive tokens across shard boundaries.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from stateloop.config import ConfigError
from stateloop.files import atomic_write_bytes, atomic_write_json

META = "meta.json"
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


class ShardWriter:
    """Append token arrays to one split in shards of ``shard_tokens`` tokens, each renamed into
    place when full; ``close()`` returns the split's meta entry. It hashes what it writes and keeps
    each shard's largest id (:attr:`tops`) for :func:`stamp_verified`; :meth:`state` and
    :meth:`restore` let an interrupted tokenization continue."""

    def __init__(self, data_dir: str | Path, split: str, dtype: np.dtype, shard_tokens: int = 1 << 27):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.split, self.dtype, self.shard_tokens = split, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []
        self.tops: dict[str, int] = {}  # shard file -> its largest token id
        self._fh = None
        self._n = 0
        self._top = -1
        self._hash = None

    def _open(self) -> None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        self._name = name
        self._tmp = self.dir / f".{name}.tmp"
        self._fh = open(self._tmp, "wb")
        self._n = 0
        self._top = -1
        self._hash = hashlib.sha256()

    def _finish(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.dir / self._name)
        self.shards.append({"file": self._name, "tokens": self._n, "sha256": self._hash.hexdigest()})
        self.tops[self._name] = self._top
        self._fh = None

    def add(self, tokens) -> None:
        arr = np.asarray(tokens, dtype=self.dtype)
        while arr.size:
            if self._fh is None:
                self._open()
            take = min(arr.size, self.shard_tokens - self._n)
            data = arr[:take].astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
            self._fh.write(data)
            self._hash.update(data)
            self._top = max(self._top, int(arr[:take].max()))
            self._n += take
            arr = arr[take:]
            if self._n == self.shard_tokens:
                self._finish()

    def state(self) -> dict:
        """What :meth:`restore` needs to continue from here; the open shard's bytes are made
        durable first (flush, fsync). Each complete shard's size, mtime and inode are kept, so
        that a shard changed since is noticed."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        files = {}
        for shard in self.shards:
            st = (self.dir / shard["file"]).stat()
            files[shard["file"]] = [st.st_size, st.st_mtime_ns, st.st_ino]
        return {"shards": self.shards, "tops": self.tops, "files": files,
                "open_tokens": self._n if self._fh is not None else 0}

    @staticmethod
    def check_state(data_dir: str | Path, split: str, dtype: np.dtype, state: dict) -> None:
        """ValueError (one line) where the files :meth:`state` recorded are no longer as it left
        them: a complete shard missing or changed (size, mtime, inode), the open one shorter."""
        folder = Path(data_dir)
        for shard in state["shards"]:
            path = folder / shard["file"]
            st = path.stat() if path.is_file() else None
            if st is None or [st.st_size, st.st_mtime_ns, st.st_ino] != state["files"].get(shard["file"]):
                raise ValueError(f"{path}: missing or changed since it was written")
        n = int(state["open_tokens"])
        name = f"{split}_{len(state['shards']):05d}.bin"
        # the open shard: still its temporary file, or already complete and renamed after the record
        found = next((p for p in (folder / f".{name}.tmp", folder / name) if p.is_file()), None)
        if n and (found is None or found.stat().st_size < n * np.dtype(dtype).itemsize):
            raise ValueError(f"{folder / name}: shorter than the {n} tokens recorded")

    @classmethod
    def restore(cls, data_dir: str | Path, split: str, dtype: np.dtype, shard_tokens: int, state: dict) -> ShardWriter:
        """A writer continuing from :meth:`state`'s record (checked by :meth:`check_state`)."""
        w = cls(data_dir, split, dtype, shard_tokens)
        cls.check_state(data_dir, split, dtype, state)
        w.shards, w.tops = [dict(s) for s in state["shards"]], {k: int(v) for k, v in state["tops"].items()}
        n = int(state["open_tokens"])
        if n:
            w._open_existing(n)
        return w

    def _open_existing(self, n: int) -> None:
        """Reopen the open shard's temporary file, cut back to its first ``n`` tokens."""
        name = f"{self.split}_{len(self.shards):05d}.bin"
        tmp = self.dir / f".{name}.tmp"
        size = n * self.dtype.itemsize
        if not tmp.is_file():  # completed (and renamed) after the record: open again, cut back below
            os.replace(self.dir / name, tmp)
        fh = open(tmp, "r+b")
        fh.truncate(size)
        h, top = _scan(fh, self.dtype.newbyteorder("<"))
        fh.seek(size)
        self._name, self._tmp, self._fh, self._n, self._top, self._hash = name, tmp, fh, n, top, h

    @property
    def tokens(self) -> int:
        """Tokens added so far (finished shards and the open one)."""
        return sum(s["tokens"] for s in self.shards) + (self._n if self._fh is not None else 0)

    def close(self) -> dict:
        if self._fh is not None and self._n:
            self._finish()
        elif self._fh is not None:
            self._fh.close()
            Path(self._tmp).unlink(missing_ok=True)
        return {"tokens": sum(s["tokens"] for s in self.shards), "shards": self.shards}


def write_meta(data_dir: str | Path, meta: dict) -> None:
    atomic_write_json(Path(data_dir) / META, {"format": FORMAT_VERSION, **meta})


def read_meta(data_dir: str | Path) -> dict:
    path = Path(data_dir) / META
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no token shards here (run `stateloop tokenize` first)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{path}: not valid JSON ({err}); rerun `stateloop tokenize` to write it anew") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(meta).__name__}; rerun `stateloop tokenize`")
    return meta


VERIFIED = ".verified"  # per-shard stamps of a shard already verified (verify_once)
_reverify = False  # set within reverify(): every shard opened is read in full, whatever its stamp


@contextlib.contextmanager
def reverify():
    """Within this block every shard opened is read in full again, its stamp ignored (and then
    written anew): ``stateloop train --verify-shards``."""
    global _reverify
    before, _reverify = _reverify, True
    try:
        yield
    finally:
        _reverify = before


def _scan(fh, dtype: np.dtype, chunk: int = 1 << 22):
    """(the sha256 object, largest token id) of what is left to read in ``fh`` (-1 for nothing)."""
    h, top = hashlib.sha256(), -1
    while block := fh.read(chunk - chunk % dtype.itemsize):
        h.update(block)
        ids = np.frombuffer(block, dtype=dtype)
        top = max(top, int(ids.max())) if ids.size else top
    return h, top


def scan_shard(path: Path, dtype: np.dtype, chunk: int = 1 << 22) -> tuple[str, int]:
    """(sha256, largest token id) of a shard, in one pass (-1 for an empty one)."""
    with open(path, "rb") as fh:
        h, top = _scan(fh, dtype, chunk)
    return h.hexdigest(), top


def stamp_key(path: Path, sha256: str, vocab_size: int) -> str:
    """What a shard's stamp records: the file's size, mtime, change time (ctime) and inode, the
    checksum it matched and the vocabulary its ids were checked against."""
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {sha256} {vocab_size}"


def stamp_verified(path: Path, sha256: str, top: int, vocab_size: int) -> None:
    """Stamp a shard as :func:`verify_once` does after reading it, for the writer that has just
    hashed its bytes (``sha256``) and seen its largest id (``top``): the first training to open it
    then does not read it again, nor does each of its ranks. ValueError where an id is outside
    the vocabulary."""
    if top >= vocab_size:
        raise ValueError(f"{path}: token id {top} is outside the vocabulary (vocab_size {vocab_size})")
    atomic_write_bytes(path.parent / VERIFIED / path.name, stamp_key(path, sha256, vocab_size).encode())


def verify_once(path: Path, sha256: str | None, dtype: np.dtype, vocab_size: int, chunk: int = 1 << 22) -> None:
    """Check a shard in full the first time it is opened: its sha256 against meta.json's (none
    recorded: refused) and every id against the vocabulary. A stamp (:func:`stamp_key`) skips the
    pass while size, mtime, ctime and inode are unchanged (no tool can set a ctime back); bit rot
    no attribute shows passes it: :func:`reverify` reads every shard again."""
    if not sha256:
        raise ConfigError(f"{path}: meta.json records no sha256 for it, so its contents cannot be verified "
                          f"(tokenize again to record checksums)")
    stamp = path.parent / VERIFIED / path.name
    key = stamp_key(path, sha256, vocab_size)
    with contextlib.suppress(OSError):
        if not _reverify and stamp.read_text() == key:
            return
    digest, top = scan_shard(path, dtype, chunk)
    failure = None
    if digest != sha256:
        failure = f"{path}: contents do not match the sha256 in meta.json (the shard was changed or is corrupt; tokenize again)"
    elif top >= vocab_size:
        failure = (f"{path}: token id {top} is outside the vocabulary (vocab_size {vocab_size} in meta.json; "
                   f"tokenize again)")
    if failure:
        with contextlib.suppress(OSError):
            stamp.unlink(missing_ok=True)  # a stale stamp must not vouch for the file later
        raise ValueError(failure)
    with contextlib.suppress(OSError):  # a read-only data folder: verify again next time
        atomic_write_bytes(stamp, key.encode())


def open_split(data_dir: str | Path, split: str) -> ShardSet:
    """The split's :class:`ShardSet`; what it refuses, as one-line ConfigErrors."""
    try:
        return ShardSet(data_dir, split)
    except (KeyError, ValueError) as err:
        raise ConfigError(str(err.args[0])) from None


def window_count(shards: ShardSet, seq_len: int, max_windows: int | None = None) -> int:
    """How many non-overlapping windows of seq_len + 1 tokens the split holds (at most ``max_windows``);
    a ConfigError where not one does."""
    n = (len(shards) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    if n <= 0:
        raise ConfigError(f"{shards.dir}: split {shards.split!r} has {len(shards)} tokens, fewer than one window of {seq_len + 1}")
    return n


def _meta_field(meta: dict, key: str, where: Path, kind=None):
    """meta.json's ``key`` (of type ``kind``), or a one-line error naming the file and the key."""
    value = meta.get(key)
    if value is None or (kind is not None and not isinstance(value, kind)):
        what = f"no {key!r}" if value is None else f"{key!r} is not a {kind.__name__}"
        raise ValueError(f"{where}: {what} (an incomplete or foreign meta.json; rerun `stateloop tokenize`)")
    return value


class ShardSet:
    """The tokens of one split, memory-mapped, addressable as one flat array."""

    def __init__(self, data_dir: str | Path, split: str):
        self.dir = Path(data_dir)
        self.meta = read_meta(self.dir)
        where = self.dir / META
        splits = _meta_field(self.meta, "splits", where, dict)
        if split not in splits:
            raise KeyError(f"{where}: no split {split!r} (has: {', '.join(splits)})")
        self.split = split
        self.vocab_size = int(_meta_field(self.meta, "vocab_size", where, int))
        expected = token_dtype(self.vocab_size)
        if str(_meta_field(self.meta, "dtype", where)) != expected.name:
            raise ValueError(f"{where}: dtype {self.meta['dtype']!r} is not the shards' {expected.name} "
                             f"(vocab_size {self.vocab_size})")
        self.dtype = expected.newbyteorder("<")
        self.eos_id = int(_meta_field(self.meta, "eos_id", where, int))
        self.maps = []
        self.files: list[str] = []  # the shard files, in meta.json's order; each once
        for shard in _meta_field(splits[split], "shards", where, list):
            name = shard.get("file") if isinstance(shard, dict) else None
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"{where}: shard file {name!r} is not a file name inside the data folder")
            if name in self.files:  # its windows would be drawn twice an epoch, without a word
                raise ValueError(f"{where}: shard file {name!r} is listed twice in split {split!r} (an edited or foreign "
                                 f"meta.json; rerun `stateloop tokenize`)")
            self.files.append(name)
            path = self.dir / name
            if not path.is_file():
                raise FileNotFoundError(f"{path}: shard listed in meta.json is missing")
            if path.stat().st_size != shard["tokens"] * self.dtype.itemsize:
                raise ValueError(f"{path}: size does not match meta.json ({shard['tokens']} tokens)")
            verify_once(path, shard.get("sha256"), self.dtype, self.vocab_size)
            self.maps.append(np.memmap(path, dtype=self.dtype, mode="r"))
        self.offsets = np.cumsum([0] + [len(m) for m in self.maps])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def fingerprint(self) -> str:
        """A short hash of the split's shard list in meta.json (files, token counts, checksums):
        equal exactly when the split holds the same tokens in the same order."""
        shards = json.dumps(self.meta["splits"][self.split]["shards"], sort_keys=True)
        return hashlib.sha256(shards.encode()).hexdigest()[:16]

    def window(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int64, read across shard boundaries."""
        if start < 0 or start + length > len(self):
            raise IndexError(f"window [{start}, {start + length}) outside the {len(self)} tokens of {self.split}")
        out = np.empty(length, dtype=np.int64)
        pos, filled = start, 0
        i = int(np.searchsorted(self.offsets, start, side="right") - 1)
        while filled < length:
            local = pos - self.offsets[i]
            take = min(length - filled, len(self.maps[i]) - local)
            out[filled : filled + take] = self.maps[i][local : local + take]
            filled += take
            pos += take
            i += 1
        return out
