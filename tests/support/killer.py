"""A training command that SIGKILLs itself at one point of a checkpoint's life (test-only patches):

    python killer.py POINT STEP TRAIN-ARGS...

runs ``stateloop.cli.main(TRAIN-ARGS)`` with the patch of POINT at checkpoint STEP. Under two or
more devices Fabric starts the other ranks by running this same command line again, so each rank
kills itself at the same point (tests/train/test_faults.py, test_compile_train.py)."""

import io
import os
import pathlib
import re
import signal
import sys

import torch

from stateloop.cli import main
from stateloop.train import checkpoint as C


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def patch(point: str, at: int) -> None:
    def is_at(path):
        return f"step_{at:08d}.ckpt" in str(path)

    if point == "mid-write":  # half of the checkpoint's bytes on disk
        save = torch.save

        def half_save(obj, f, *a, **k):
            if isinstance(obj, dict) and obj.get("step") == at and hasattr(f, "write"):
                buf = io.BytesIO()
                save(obj, buf, *a, **k)
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                f.flush()
                die()
            return save(obj, f, *a, **k)
        torch.save = half_save
    elif point == "before-rename":  # complete temporary file, not yet renamed
        replace = pathlib.Path.replace

        def replace_or_die(self, target):
            if is_at(target) and self.name.endswith(".tmp"):
                die()
            return replace(self, target)
        pathlib.Path.replace = replace_or_die
    elif point == "before-sidecar":  # renamed into place, its sidecar not yet written
        write = C.atomic_write_json
        C.atomic_write_json = lambda p, obj: die() if is_at(p) else write(p, obj)
    elif point == "mid-prune":  # the pruned checkpoint's sidecar deleted, the checkpoint not yet
        unlink = pathlib.Path.unlink

        def unlink_or_die(self, *a, **k):
            if re.fullmatch(rf"step_{at:08d}\.ckpt", self.name):
                die()
            return unlink(self, *a, **k)
        pathlib.Path.unlink = unlink_or_die
    elif point == "after-save":  # between two steps, right after a checkpoint
        save_ckpt = C.CheckpointStore.save

        def save_then_die(self, fabric, state, step):
            out = save_ckpt(self, fabric, state, step)
            if step == at:
                die()
            return out
        C.CheckpointStore.save = save_then_die
    elif point == "mid-final-weights":  # half of model.safetensors' temporary file on disk
        import safetensors.torch as st
        save_file = st.save_file

        def half_file(tensors, filename, *a, **k):
            save_file(tensors, filename, *a, **k)
            if pathlib.Path(filename).name.startswith(".model.safetensors."):
                data = pathlib.Path(filename).read_bytes()
                pathlib.Path(filename).write_bytes(data[: len(data) // 2])
                die()
        st.save_file = half_file
    else:
        raise SystemExit(f"killer.py: unknown point {point!r}")


if __name__ == "__main__":
    patch(sys.argv[1], int(sys.argv[2]))
    sys.exit(main(sys.argv[3:]))
