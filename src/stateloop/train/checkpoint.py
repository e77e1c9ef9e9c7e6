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

(:func:`rng_to_plain`; older checkpoints' numpy arrays: files.LEGACY_NUMPY_GLOBALS). A checkpoint
the safe unpickler refuses is reported like a corrupt one and skipped.

Writing: rank 0 writes the file under a temporary name (FSDP gathers the full state dict to it),
hashes it, renames it into place and writes the sidecar. A process killed at any point leaves a
complete pair or a leftover that :meth:`CheckpointStore.latest` passes over, saying so in one line,
and the next training removes (:meth:`CheckpointStore.clean_leftovers`). A failed write removes
what it wrote and raises one ``OSError`` naming the file; the previous checkpoint stays intact.
"""

from __future__ import annotations

import glob
import json
import re
import sys
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.data.shards import sha256_file
from stateloop.files import _numpy_globals, atomic_write_json, is_unsafe_load_error, safe_torch_load, torch_write_error, unsafe_load_message
from stateloop.runs import FINAL_WEIGHTS, MLFLOW_FILE, RUN_CONFIG, TRAIN_SUMMARY

NAME = re.compile(r"step_(\d{8})\.ckpt")


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
        found = [int(m.group(1)) for p in self.dir.iterdir() if (m := NAME.fullmatch(p.name))]
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
    def load_into(fabric, path: str | Path, state: dict) -> dict:
        """``fabric.load`` with the safe unpickler; a refused file is a one-line ConfigError.
        Returns what the checkpoint holds beyond ``state``'s keys (a key older checkpoints lack
        is read from there: ``state`` names only what every checkpoint has).

        Fabric's FSDP strategy reads a full-state-dict file with its own lazy unpickler, which
        ignores ``weights_only``: every rank therefore first reads the file with the safe
        unpickler (memory-mapped, cheap) and loads it only when that succeeds."""
        import torch

        problem = CheckpointStore.check_safe(Path(path))
        if problem is not None:
            raise ConfigError(problem)
        try:
            with torch.serialization.safe_globals(_numpy_globals()):  # legacy checkpoints' numpy RNG key
                return fabric.load(path, state, weights_only=True) or {}
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
        try:
            fabric.save(tmp, state)
            fabric.barrier()
            if fabric.is_global_zero:
                _fsync(tmp)
                size = tmp.stat().st_size
                digest, hashed = _hashed_while_written(fabric).pop(str(tmp), (None, -1))
                if hashed != size:  # not hashed while written (FSDP writes with torch.save): read it back
                    digest = sha256_file(tmp)
                tmp.replace(final)
                atomic_write_json(self.sidecar(final), {"sha256": digest, "bytes": size, "step": step})
        except (OSError, RuntimeError) as failure:
            err = torch_write_error(failure, tmp)  # torch's zip writer reports a full disk as RuntimeError
            if err is None:
                raise
            if fabric.is_global_zero:  # nothing half-written stays: no tmp, no checkpoint without its sidecar
                tmp.unlink(missing_ok=True)
                if not self.sidecar(final).is_file():
                    final.unlink(missing_ok=True)
            previous = next((self.path(s) for s in self.steps() if s != step and self.sidecar(self.path(s)).is_file()), None)
            kept = f"the previous checkpoint {previous.name} is intact" if previous else "there is no earlier checkpoint"
            raise OSError(err.errno, f"{final}: not written ({err.strerror or err}); {kept}: free space in {self.dir} "
                                     f"and rerun the command to resume") from None
        if fabric.is_global_zero:
            self.prune()
        fabric.barrier()
        return final

    def prune(self) -> None:
        complete = [s for s in self.steps() if self.sidecar(self.path(s)).is_file()]
        for step in complete[self.keep :]:
            self.sidecar(self.path(step)).unlink(missing_ok=True)  # sidecar first: never a valid-looking orphan
            self.path(step).unlink(missing_ok=True)  # a kill right before this: clean_leftovers removes it

    def clean_leftovers(self) -> None:
        """Remove what interrupted writes and prunes left: temporary files and checkpoints without
        a sidecar (never used: they cannot be verified). Rank 0, before training writes anything."""
        if not self.dir.is_dir():
            return
        leftovers = list(self.dir.glob(".step_*.tmp"))
        leftovers += [self.path(s) for s in self.steps() if not self.sidecar(self.path(s)).is_file()]
        for p in leftovers:
            p.unlink(missing_ok=True)
        if leftovers:
            warn(f"removed {len(leftovers)} incomplete file(s) of interrupted writes: {', '.join(p.name for p in leftovers)}")


# The files training writes into the run folder, each through a temporary file beside it,
# ``.<name>.XXXXXXXX.tmp`` (files.atomic_write_bytes, files.write_safetensors).
RUN_FILES = (FINAL_WEIGHTS, TRAIN_SUMMARY, RUN_CONFIG, MLFLOW_FILE)


def clean_run_folder(run_dir: Path) -> None:
    """Remove the temporary files that a killed write of one of :data:`RUN_FILES` left in the run
    folder (a SIGKILL inside the final weights' write, say), and only those. Rank 0, while holding
    the folder's lock, before training writes anything: no other write of these files is under way."""
    leftovers = [p for name in RUN_FILES for p in sorted(Path(run_dir).glob(f".{glob.escape(name)}.*.tmp")) if p.is_file()]
    for p in leftovers:
        p.unlink(missing_ok=True)
    if leftovers:
        warn(f"{run_dir}: removed {len(leftovers)} incomplete file(s) of interrupted writes: "
             f"{', '.join(p.name for p in leftovers)}")


def direct_checkpoint_io():
    """Fabric's checkpoint writer for one process and DDP, writing straight to the given path.

    Fabric's default serialises the checkpoint into memory and a ``$TMPDIR`` file first (a second
    copy in RAM, and on a node-local /tmp that may be too small). This writer streams to
    :meth:`CheckpointStore.save`'s temporary name, fsyncs, and hashes the bytes as they go
    (``written[path] = (sha256, bytes)``), so the sidecar needs no second read. Hashing costs 9-17 s
    of rank 0's time per save at 1.44B (benchmarks/checkpoint_hash.py): the price of never resuming
    from a torn or altered file."""
    import hashlib
    import os

    import torch
    from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

    class HashingFile:
        def __init__(self, fh):
            self.fh, self.sha256, self.bytes = fh, hashlib.sha256(), 0

        def write(self, data) -> int:
            self.sha256.update(data)
            self.bytes += len(data)
            return self.fh.write(data)

        def flush(self) -> None:
            self.fh.flush()

    class DirectCheckpointIO(TorchCheckpointIO):
        def __init__(self):
            self.written: dict[str, tuple[str, int]] = {}

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            with open(path, "wb") as fh:
                out = HashingFile(fh)
                torch.save(checkpoint, out)
                fh.flush()
                os.fsync(fh.fileno())
            self.written[str(path)] = (out.sha256.hexdigest(), out.bytes)

    return DirectCheckpointIO()


def _hashed_while_written(fabric) -> dict:
    """The (sha256, bytes) of the files :func:`direct_checkpoint_io` wrote, by path; empty under a
    strategy that writes without it (FSDP's ModelParallelStrategy has no CheckpointIO at all)."""
    try:
        return getattr(fabric.strategy.checkpoint_io, "written", {})
    except NotImplementedError:
        return {}


def _fsync(path: Path) -> None:
    import os

    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


# -- RNG states as tensors and plain values ------------------------------------------------------
def collect_rng() -> dict:
    """The global RNG states of torch, CUDA, numpy and Python, safe-loadable (public APIs; the
    keys and layout of ``lightning_fabric``'s private ``_collect_rng_states``, so checkpoints
    written through it resume unchanged)."""
    import random

    import numpy as np
    import torch

    states = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
              "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}
    return rng_to_plain(states)


def restore_rng(plain: dict) -> None:
    """Set the states :func:`collect_rng` returned (or an older checkpoint's)."""
    import random

    import numpy as np
    import torch

    states = rng_from_plain(plain)
    torch.set_rng_state(states["torch"])
    if "torch.cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch.cuda"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    random.setstate(states["python"])


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
