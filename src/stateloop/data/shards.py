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

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from stateloop.config import ConfigError
from stateloop.runs import atomic_write_bytes, atomic_write_json

META = "meta.json"
FORMAT_VERSION = 1


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class ShardWriter:
    """Append token arrays to one split; cuts shards of ``shard_tokens`` tokens, each written
    to ``.name.tmp`` and renamed when full. ``close()`` returns the split's meta entry."""

    def __init__(self, data_dir: str | Path, split: str, dtype: np.dtype, shard_tokens: int = 1 << 27):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.split, self.dtype, self.shard_tokens = split, np.dtype(dtype), shard_tokens
        self.shards: list[dict] = []
        self._fh = None
        self._n = 0
        self._hash = None

    def _open(self) -> None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        self._name = name
        self._tmp = self.dir / f".{name}.tmp"
        self._fh = open(self._tmp, "wb")
        self._n = 0
        self._hash = hashlib.sha256()

    def _finish(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        os.replace(self._tmp, self.dir / self._name)
        self.shards.append({"file": self._name, "tokens": self._n, "sha256": self._hash.hexdigest()})
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
            self._n += take
            arr = arr[take:]
            if self._n == self.shard_tokens:
                self._finish()

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


VERIFIED = ".verified"  # per-shard stamps of a checksum already verified (size, mtime, sha256)


def verify_once(path: Path, sha256: str | None) -> None:
    """Check a shard against the sha256 meta.json records, in full, the first time it is opened;
    a stamp (``.verified/<file>``: size, mtime and the checksum) lets later opens skip the hashing
    until the file changes. A shard rewritten in place (another size or mtime) is hashed again."""
    if not sha256:
        return
    st = path.stat()
    stamp = path.parent / VERIFIED / path.name
    key = f"{st.st_size} {st.st_mtime_ns} {sha256}"
    try:
        if stamp.read_text() == key:
            return
    except OSError:
        pass
    if sha256_file(path) != sha256:
        raise ValueError(f"{path}: contents do not match the sha256 in meta.json (the shard was changed or is corrupt; "
                         f"tokenize again)")
    try:
        atomic_write_bytes(stamp, key.encode())
    except OSError:
        pass  # a read-only data folder: verify again next time


class ShardSet:
    """The tokens of one split, memory-mapped, addressable as one flat array."""

    def __init__(self, data_dir: str | Path, split: str):
        self.dir = Path(data_dir)
        self.meta = read_meta(self.dir)
        splits = self.meta["splits"]
        if split not in splits:
            raise KeyError(f"{self.dir / META}: no split {split!r} (has: {', '.join(splits)})")
        self.split = split
        self.vocab_size = int(self.meta["vocab_size"])
        expected = token_dtype(self.vocab_size)
        if str(self.meta["dtype"]) != expected.name:
            raise ValueError(f"{self.dir / META}: dtype {self.meta['dtype']!r} is not the shards' {expected.name} "
                             f"(vocab_size {self.vocab_size})")
        self.dtype = expected.newbyteorder("<")
        self.eos_id = int(self.meta["eos_id"])
        self.maps = []
        for shard in splits[split]["shards"]:
            path = self.dir / shard["file"]
            if not path.is_file():
                raise FileNotFoundError(f"{path}: shard listed in meta.json is missing")
            if path.stat().st_size != shard["tokens"] * self.dtype.itemsize:
                raise ValueError(f"{path}: size does not match meta.json ({shard['tokens']} tokens)")
            verify_once(path, shard.get("sha256"))
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
