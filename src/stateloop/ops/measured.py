"""Measurements kept on disk between processes: ``stateloop plan`` and the config check's memory
gate measure each model shape once (ops/memory.py's fake-tensor forward, models/flops.py's FLOP
count through :func:`keep_flop_counts`), not on every call.

A measurement is a small JSON file under :func:`cache_dir` ``/<kind>/``, named by the sha256 of
what it was measured from: the arguments (the model config, shapes, precision) and the digest of
the code that measures (:func:`code_digest`: the source of the models and of the measuring
module, and torch's version). A change to any of them is another name, so a stale measurement is
never read; old files are left in place (each is a few hundred bytes).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

from stateloop.files import atomic_write_bytes
from stateloop.models import counted

ROOT = Path(__file__).resolve().parents[1]  # src/stateloop


def cache_dir(kind: str) -> Path | None:
    """Where measurements of ``kind`` are kept: ``$STATELOOP_CACHE/<kind>`` (``STATELOOP_CACHE``
    empty: nowhere), else ``$XDG_CACHE_HOME/stateloop/<kind>`` (``~/.cache``)."""
    env = os.environ.get("STATELOOP_CACHE")
    if env is not None:
        return Path(env) / kind if env else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stateloop" / kind


@functools.cache
def code_digest(*modules: str) -> str:
    """sha256 of the source of every file under src/stateloop/models and of ``modules`` (paths
    relative to src/stateloop), and of torch's version."""
    import importlib.metadata

    h = hashlib.sha256()
    paths = sorted({*(ROOT / "models").rglob("*.py"), *(ROOT / m for m in modules)})
    for path in paths:
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        h.update(importlib.metadata.version("torch").encode())
    return h.hexdigest()


def key(*parts) -> str:
    """The name of a measurement of ``parts`` (JSON-serialisable; dataclasses by ``repr``)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def load(kind: str, name: str):
    """The stored measurement ``name`` of ``kind``, or None."""
    folder = cache_dir(kind)
    if folder is None:
        return None
    try:
        return json.loads((folder / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def store(kind: str, name: str, value) -> None:
    """Keep ``value`` as the measurement ``name`` of ``kind`` (quietly nothing where it cannot be written)."""
    folder = cache_dir(kind)
    if folder is None:
        return
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / f"{name}.json", json.dumps(value).encode())


class Kept(dict):
    """A table of measurements of ``kind`` by name that is kept on disk too: a name not in memory is
    read from disk (:func:`load`), and one set is stored (:func:`store`), each under the name with the
    digest of the code that measures (:func:`code_digest` of ``modules``) added."""

    def __init__(self, kind: str, *modules: str):
        super().__init__()
        self.kind, self.modules = kind, modules

    def _name(self, name: str) -> str:
        return key(name, code_digest(*self.modules))

    def get(self, name, default=None):
        if name not in self:
            found = load(self.kind, self._name(name))
            if found is None:
                return default
            super().__setitem__(name, found)
        return self[name]

    def __setitem__(self, name, value) -> None:
        super().__setitem__(name, value)
        store(self.kind, self._name(name), value)


def keep_flop_counts() -> None:
    """models/flops.py's counts (``compute_profile``) kept on disk as well as in this process, kind
    "flops" (models/counted.py's table swapped for a :class:`Kept` one): the commands that count call
    it (train, render, plan); models/ reads no cache itself."""
    if not isinstance(counted.PROFILES, Kept):
        kept = Kept("flops")
        dict.update(kept, counted.PROFILES)
        counted.PROFILES = kept
