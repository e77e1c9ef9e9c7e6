"""Measurements kept on disk between processes: ``stateloop plan`` and the config check's memory
gate measure each model shape once (ops/memory.py's fake-tensor forward, models/flops.py's FLOP
count), not on every call.

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

ROOT = Path(__file__).resolve().parent  # src/stateloop


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
