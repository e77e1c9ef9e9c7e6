"""Resumable checkpoints, written atomically and verified before use.

    RUN_DIR/checkpoints/
        step_00000100.ckpt          Fabric checkpoint: model, optimizer, scheduler, step, tokens,
                                    RNG states, elapsed time, MLflow run id, resolved config,
                                    and which train tokens fed it (folder, count, shard hash)
        step_00000100.ckpt.sha256   sidecar {"sha256", "bytes", "step"}: written last, so its
                                    presence marks the checkpoint complete

Format: everything in a checkpoint loads with torch's safe unpickler (``weights_only=True``):
tensors, dicts, lists, tuples, ints, floats, strings, bools and None. The model and optimizer
state dicts are tensors and plain values already; the RNG states are stored as

    rng = {"torch": uint8 tensor, "torch.cuda": [uint8 tensor per device] (CUDA present),
           "python": [version, [625 ints], gauss or None],
           "numpy": {"kind": "MT19937", "key": int64 tensor [624], "pos": int, "has_gauss": int,
                     "cached_gaussian": float}}

(:func:`rng_to_plain` / :func:`rng_from_plain`). Checkpoints written before this format hold
numpy's key as a numpy array; the safe loader accepts plain numpy arrays for those
(:data:`stateloop.runs.LEGACY_NUMPY_GLOBALS`), so old run folders resume unchanged. A checkpoint
the safe unpickler refuses (it would run code to load) is reported like a corrupt one and skipped.

Writing: every rank calls ``fabric.save`` on a temporary name (rank 0 writes the file; FSDP
uses the full state dict, one file); rank 0 then hashes it, renames it into place and writes the
sidecar atomically. A process killed at any point leaves either a complete, verifiable pair or a
leftover that :meth:`CheckpointStore.latest` passes over: a temporary file, a checkpoint without
its sidecar, or one whose bytes no longer match their hash. Those are reported with a one-line
message and the previous complete checkpoint is used.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.data.shards import sha256_file
from stateloop.runs import atomic_write_json, safe_torch_load

NAME = re.compile(r"^step_(\d{8})\.ckpt$")


def warn(msg: str) -> None:
    print(f"stateloop train: {msg}", file=sys.stderr, flush=True)


class CheckpointStore:
    def __init__(self, folder: str | Path, keep: int = 2):
        self.dir = Path(folder)
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.ckpt"

    @staticmethod
    def sidecar(path: Path) -> Path:
        return path.with_name(path.name + ".sha256")

    def steps(self) -> list[int]:
        """Steps of every checkpoint file present (complete or not), newest first."""
        if not self.dir.is_dir():
            return []
        found = [int(m.group(1)) for p in self.dir.iterdir() if (m := NAME.match(p.name))]
        return sorted(found, reverse=True)

    def verify(self, step: int) -> str | None:
        """None when the checkpoint of ``step`` is complete and intact, else why not."""
        path = self.path(step)
        side = self.sidecar(path)
        if not side.is_file():
            return f"{path}: incomplete (no {side.name}: the write was interrupted)"
        try:
            meta = json.loads(side.read_text())
            expected, size = meta["sha256"], int(meta["bytes"])
        except (ValueError, KeyError, TypeError) as err:
            return f"{side}: unreadable ({type(err).__name__})"
        if path.stat().st_size != size:
            return f"{path}: truncated or corrupt ({path.stat().st_size} bytes, {size} expected)"
        if sha256_file(path) != expected:
            return f"{path}: corrupt (sha256 does not match {side.name})"
        return self.check_safe(path)

    @staticmethod
    def check_safe(path: Path) -> str | None:
        """None when the safe unpickler reads ``path`` (nothing in it runs code), else why not."""
        try:
            safe_torch_load(path, mmap=True, legacy_numpy=True)
        except ConfigError as err:
            return str(err)
        return None

    @staticmethod
    def load_into(fabric, path: str | Path, state: dict) -> None:
        """``fabric.load`` with the safe unpickler; a refused file is a one-line ConfigError.

        Fabric's FSDP strategy reads a full-state-dict file with its own lazy unpickler, which
        ignores ``weights_only``: every rank therefore first reads the file with the safe
        unpickler (memory-mapped, cheap) and loads it only when that succeeds."""
        import torch

        from stateloop.runs import _numpy_globals, is_unsafe_load_error, unsafe_load_message

        problem = CheckpointStore.check_safe(Path(path))
        if problem is not None:
            raise ConfigError(problem)
        try:
            with torch.serialization.safe_globals(_numpy_globals()):  # legacy checkpoints' numpy RNG key
                fabric.load(path, state, weights_only=True)
        except Exception as err:
            if is_unsafe_load_error(err):
                raise ConfigError(unsafe_load_message(path, err)) from None
            raise

    def latest(self) -> Path | None:
        """The newest complete, intact checkpoint; each newer broken one is reported and skipped."""
        skipped = []
        for step in self.steps():
            problem = self.verify(step)
            if problem is None:
                if skipped:
                    warn(f"using the previous checkpoint {self.path(step).name} instead")
                return self.path(step)
            warn(problem)
            skipped.append(step)
        return None

    # -- writing (rank 0 for the file operations; every rank calls save) -------------------------
    def save(self, fabric, state: dict, step: int) -> Path:
        """Write the checkpoint of ``step`` atomically, then prune old ones (keeping ``keep``)."""
        final = self.path(step)
        tmp = final.with_name(f".{final.name}.tmp")
        if fabric.is_global_zero:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.sidecar(final).unlink(missing_ok=True)  # an older write of this step is no longer valid
        fabric.barrier()
        fabric.save(tmp, state)
        fabric.barrier()
        if fabric.is_global_zero:
            _fsync(tmp)
            digest, size = sha256_file(tmp), tmp.stat().st_size
            tmp.replace(final)
            atomic_write_json(self.sidecar(final), {"sha256": digest, "bytes": size, "step": step})
            self.prune()
        fabric.barrier()
        return final

    def prune(self) -> None:
        complete = [s for s in self.steps() if self.sidecar(self.path(s)).is_file()]
        for step in complete[self.keep :]:
            self.sidecar(self.path(step)).unlink(missing_ok=True)  # sidecar first: never a valid-looking orphan
            self.path(step).unlink(missing_ok=True)

    def clean_temporaries(self) -> None:
        if self.dir.is_dir():
            for p in self.dir.glob(".step_*.tmp"):
                p.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    import os

    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


# -- RNG states as tensors and plain values ------------------------------------------------------
def rng_to_plain(states: dict) -> dict:
    """``lightning_fabric``'s collected RNG states with numpy's and Python's made safe-loadable."""
    import torch

    out = dict(states)
    if "python" in out:
        version, internal, gauss = out["python"]
        out["python"] = [int(version), [int(x) for x in internal], gauss]
    if "numpy" in out and isinstance(out["numpy"], tuple):
        kind, key, pos, has_gauss, cached = out["numpy"]
        out["numpy"] = {"kind": str(kind), "key": torch.from_numpy(key.astype("int64")), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    return out


def rng_from_plain(states: dict) -> dict:
    """The inverse of :func:`rng_to_plain` (also accepts the tuples of older checkpoints)."""
    import numpy as np

    out = dict(states)
    if "python" in out:
        version, internal, gauss = out["python"]
        out["python"] = (int(version), tuple(int(x) for x in internal), gauss)
    if isinstance(out.get("numpy"), dict):
        n = out["numpy"]
        key = n["key"].numpy() if hasattr(n["key"], "numpy") else np.asarray(n["key"])
        out["numpy"] = (n["kind"], key.astype(np.uint32), int(n["pos"]), int(n["has_gauss"]), float(n["cached_gaussian"]))
    return out
