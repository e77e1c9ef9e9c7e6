"""Resumable checkpoints, written atomically and verified before use.

    RUN_DIR/checkpoints/
        step_00000100.ckpt          Fabric checkpoint: model, optimizer, scheduler, step, tokens,
                                    RNG states, elapsed time, MLflow run id, resolved config,
                                    and which train tokens fed it (folder, count, shard hash)
        step_00000100.ckpt.sha256   sidecar {"sha256", "bytes", "step"}: written last, so its
                                    presence marks the checkpoint complete

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

from stateloop.data.shards import sha256_file
from stateloop.runs import atomic_write_json

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
        return None

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
