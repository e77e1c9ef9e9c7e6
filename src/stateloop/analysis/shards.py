"""Exact sums over the held-out windows, split into shards that resume after an interruption.

Both analyses of Sec. 5 run "on the full Pile validation set": at the paper's scale about two GPU
days for the Shapley values (ops/analysis_cost.py estimates each job). [choice] So an analysis may
run as N jobs, each on a contiguous run of whole batches (shard I of N: batches
[floor((I-1) n / N), floor(I n / N)) of n), and a merge that adds their sums. Sharding changes no
number: each batch's float64 sums are added as exact rationals (``Fraction``) and rounded once,
when the mean is taken, so the order and grouping of the additions do not matter.

A running shard keeps its partial sums in ``RUN_DIR/analysis_shards/<analysis>_<I>of<N>.partial.json``
and continues from them when run again with the same settings (:func:`shard_key`, the code
version); a finished one writes ``<analysis>_<I>of<N>.json``. The merge refuses, in one line, a
missing, unfinished or foreign shard, and shards that do not cover every batch exactly once.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.files import atomic_write_json

SHARDS_DIR = "analysis_shards"  # in the run folder: the shard files and the partial results
FORMAT = 1  # of the shard and partial files
# What the merge of N > 1 shards asks the scheduler for (analysis/jobs.py): it reads the shards'
# sums and hashes the weights, no GPU; runtime and memory at most the analyze stage's.
MERGE_JOB = {"runtime": 30, "mem_mb": 4000, "cpus_per_task": 1, "gpus": 0}


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1-based), as ``--shard I/N`` names it."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str, flag: str = "--shard") -> Shard:
        parts = str(text).split("/")
        try:
            index, count = (int(p) for p in parts)
        except ValueError:
            raise ConfigError(f"{flag}: expected I/N (shard I of N, 1 <= I <= N), got {text!r}") from None
        if not 1 <= index <= count:
            raise ConfigError(f"{flag}: expected I/N with 1 <= I <= N, got {text!r}")
        return cls(index, count)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def stem(self) -> str:
        return f"{self.index}of{self.count}"

    def batches(self, n_batches: int) -> tuple[int, int]:
        """Its batches [lo, hi) of ``n_batches``."""
        return (self.index - 1) * n_batches // self.count, self.index * n_batches // self.count


def n_batches(n_windows: int, batch_size: int) -> int:
    return math.ceil(n_windows / batch_size)


def shard_file(run_dir, analysis: str, shard: Shard) -> Path:
    """Where a finished shard's sums go (the merge reads them there)."""
    return Path(run_dir) / SHARDS_DIR / f"{analysis}_{shard.stem}.json"


def partial_file(run_dir, analysis: str, shard: Shard) -> Path:
    """Where a running shard keeps its partial sums."""
    return Path(run_dir) / SHARDS_DIR / f"{analysis}_{shard.stem}.partial.json"


def encode(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def decode(text, where: str) -> Fraction:
    try:
        num, den = str(text).split("/")
        return Fraction(int(num), int(den))
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"{where}: {text!r} is not an exact sum (numerator/denominator)") from None


class Sums:
    """Exact sums of named float64 values over batches, and the tokens they cover."""

    def __init__(self, names, values: dict[str, Fraction] | None = None, tokens: int = 0):
        self.names = list(names)
        self.values = values if values is not None else {name: Fraction(0) for name in self.names}
        self.tokens = int(tokens)

    def add(self, batch: dict[str, float], tokens: int) -> None:
        """One batch: its float64 sum of each name (every name, no other) and its token count."""
        if set(batch) != set(self.names):
            raise ValueError(f"a batch gave sums of {sorted(batch)}, expected {sorted(self.names)}")
        for name, value in batch.items():
            if not math.isfinite(value):
                raise ValueError(f"{name}: a batch's NLL sum is {value}")
            self.values[name] += Fraction(value)
        self.tokens += int(tokens)

    def __iadd__(self, other: Sums) -> Sums:
        if other.names != self.names:
            raise ValueError("sums of different names")
        for name in self.names:
            self.values[name] += other.values[name]
        self.tokens += other.tokens
        return self

    def mean(self, name: str) -> float:
        """The mean over the tokens, rounded once (to the nearest float64)."""
        return float(self.values[name] / self.tokens)

    def total(self, name: str) -> float:
        return float(self.values[name])

    def to_json(self) -> dict:
        return {"sums": {name: encode(self.values[name]) for name in self.names}, "tokens": self.tokens}

    @classmethod
    def from_json(cls, doc: dict, names, where: str) -> Sums:
        sums = doc.get("sums")
        if not isinstance(sums, dict) or set(sums) != set(names):
            raise ConfigError(f"{where}: its sums are not those of this analysis ({len(names)} names expected)")
        return cls(names, {name: decode(sums[name], where) for name in names}, int(doc.get("tokens", 0)))


def shard_key(**settings) -> dict:
    """What a shard's numbers depend on, as JSON values (compared key by key)."""
    return json.loads(json.dumps(settings, sort_keys=True))


def _difference(theirs: dict, ours: dict) -> str | None:
    for name in sorted(set(theirs) | set(ours)):
        if theirs.get(name) != ours.get(name):
            return f"{name} {theirs.get(name)!r}, here {ours.get(name)!r}"
    return None


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: unreadable shard file ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{path}: not a shard file of format {FORMAT}")
    return doc


def say(msg: str) -> None:
    print(f"stateloop analyze: {msg}", file=sys.stderr, flush=True)


def run_shard(analysis: str, key: dict, shard: Shard, n_windows: int, batch_size: int, names,
              compute: Callable[[int, int], tuple[dict[str, float], int]], partial: Path, *,
              save_every: float = 120.0, progress: bool = True, device: str = "", code_version: str = "") -> dict:
    """Evaluate the shard's batches with ``compute(lo, hi)`` (windows [lo, hi) -> each name's float64
    sum and the token count), continuing from ``partial`` where it holds this shard's sums for the
    same ``key``; write ``partial`` every ``save_every`` seconds (0: after every batch) and after the
    last batch. Returns the finished shard's document (the shard file's content)."""
    from tqdm import tqdm

    nb = n_batches(n_windows, batch_size)
    lo, hi = shard.batches(nb)
    base = {"format": FORMAT, "analysis": analysis, "key": key,
            "shard": {"index": shard.index, "count": shard.count, "batches": [lo, hi],
                      "windows": [min(lo * batch_size, n_windows), min(hi * batch_size, n_windows)]}}
    sums, start = Sums(names), lo
    resumed = _resume(partial, base, key, names, code_version)
    if resumed is not None:
        sums, start = resumed
        say(f"{partial}: continuing shard {shard.label} at batch {start} ({start - lo} of its {hi - lo} done)")
    if lo == hi:
        say(f"shard {shard.label} has no batch ({nb} batches of {batch_size} windows in all)")

    def doc(next_batch: int, complete: bool) -> dict:
        return {**base, "next_batch": next_batch, "complete": complete, **sums.to_json(), "device": device,
                "code_version": code_version}

    last = time.monotonic()
    bar = tqdm(total=hi - lo, initial=start - lo, desc=f"{analysis} {shard.label}", unit="batch", disable=not progress,
               dynamic_ncols=True)
    for b in range(start, hi):
        values, tokens = compute(b * batch_size, min((b + 1) * batch_size, n_windows))
        sums.add(values, tokens)
        bar.update(1)
        if b + 1 < hi and time.monotonic() - last >= save_every:
            atomic_write_json(partial, doc(b + 1, False))
            last = time.monotonic()
            if not progress:  # a job's log: a line per save instead of a bar
                say(f"{analysis} shard {shard.label}: {b + 1 - lo} of {hi - lo} batches done, partial sums in {partial}")
    bar.close()
    if hi > start:
        atomic_write_json(partial, doc(hi, False))  # the sums survive until the shard's result is written
    return doc(hi, True)


def _resume(partial: Path, base: dict, key: dict, names, code_version: str) -> tuple[Sums, int] | None:
    """(sums, next batch) of a partial file made for this shard and these settings, else None (saying why)."""
    if not partial.is_file():
        return None
    try:
        doc = _read(partial)
        why = _difference(doc.get("key", {}), key) or _difference(doc.get("shard", {}), base["shard"])
        if why is None and doc.get("code_version") != code_version:
            why = f"code version {doc.get('code_version')!r}, here {code_version!r}"
        if why is None:
            sums = Sums.from_json(doc, names, str(partial))
            start = int(doc["next_batch"])
            lo, hi = base["shard"]["batches"]
            if not lo <= start <= hi:
                why = f"next batch {start} outside the shard's [{lo}, {hi})"
            else:
                return sums, start
    except (ConfigError, KeyError, TypeError, ValueError) as err:
        why = str(err)
    say(f"{partial}: not continued, made for other settings ({why}); starting shard {base['shard']['index']}/"
        f"{base['shard']['count']} again")
    return None


def merge(analysis: str, key: dict, count: int, n_windows: int, batch_size: int, tokens_per_window: int, names,
          run_dir) -> tuple[Sums, list[dict]]:
    """The exact sums of the ``count`` finished shard files of ``analysis`` in the run folder, which
    must have been made for ``key`` and together cover every batch of
    the ``n_windows`` held-out windows exactly once. Returns (sums, the shard documents)."""
    nb = n_batches(n_windows, batch_size)
    total, docs = Sums(names), []
    for index in range(1, count + 1):
        shard = Shard(index, count)
        path = shard_file(run_dir, analysis, shard)
        if not path.is_file():
            raise ConfigError(f"{path}: shard {shard.label} of {analysis} is missing "
                              f"(stateloop analyze {analysis} RUN --shard {shard.label})")
        doc = _read(path)
        if doc.get("analysis") != analysis or not doc.get("complete"):
            raise ConfigError(f"{path}: not a finished shard of {analysis}")
        why = _difference(doc.get("key", {}), key)
        if why is not None:
            raise ConfigError(f"{path}: made for other settings ({why}); run shard {shard.label} again")
        theirs = doc.get("shard", {})
        if (theirs.get("index"), theirs.get("count")) != (index, count):
            raise ConfigError(f"{path}: holds shard {theirs.get('index')}/{theirs.get('count')}, not {shard.label}")
        if theirs.get("batches") != list(shard.batches(nb)) or doc.get("next_batch") != shard.batches(nb)[1]:
            raise ConfigError(f"{path}: covers batches {theirs.get('batches')}, not {list(shard.batches(nb))} "
                              f"of {nb}; run shard {shard.label} again")
        sums = Sums.from_json(doc, names, str(path))
        w_lo, w_hi = (min(b * batch_size, n_windows) for b in shard.batches(nb))
        if sums.tokens != (w_hi - w_lo) * tokens_per_window:
            raise ConfigError(f"{path}: {sums.tokens} tokens, not the {(w_hi - w_lo) * tokens_per_window} of its "
                              f"{w_hi - w_lo} windows; run shard {shard.label} again")
        total += sums
        docs.append(doc)
    return total, docs
