"""Writing and reading files safely, for every stage: atomic writes (a temporary file beside the
target, fsynced, renamed over it) of bytes, JSON, torch objects and safetensors; loads with no
unpickler or torch's safe one; and the code version that results are stamped with.

Nothing here knows about runs, configs or models: run folders are stateloop/runs.py's.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from stateloop.config import ConfigError


def current_umask() -> int:
    """The process's umask (os.umask can only be read by setting it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_beside(path: Path):
    """A temporary file next to ``path`` with the permissions an ordinary open() would give
    (mkstemp makes it owner-only, which would hide results from others on a shared cluster)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


# What torch's zip writer says when a write under it fails (a full disk): a RuntimeError, not an OSError.
TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "inline_container.cc")
SAFETENSORS_WRITE_FAILURES = ("os error",)  # safetensors' writer reports I/O errors as "... (os error 28)"


def torch_write_error(err: BaseException, path: str | Path) -> OSError | None:
    """The OSError that a failed ``torch.save`` to ``path`` stands for, else None: the error itself,
    or torch's RuntimeError of a failed write, as ENOSPC where the file system has no room left
    (else EIO)."""
    if isinstance(err, OSError):
        return err
    torch_failure = isinstance(err, RuntimeError) and any(m in str(err) for m in TORCH_WRITE_FAILURES)
    safetensors_failure = type(err).__name__ == "SafetensorError" and any(m in str(err) for m in SAFETENSORS_WRITE_FAILURES)
    if not (torch_failure or safetensors_failure):
        return None
    import errno

    try:
        st = os.statvfs(Path(path).parent)
        full = st.f_bavail * st.f_frsize < 1 << 20
    except OSError:
        full = False
    code = errno.ENOSPC if full else errno.EIO
    return OSError(code, os.strerror(code) if full else f"torch's writer failed: {str(err).strip().splitlines()[0]}")


def _atomic_write_with(path: str | Path, write) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, fsync, rename; a failed write (a full
    disk) removes the temporary file and raises one OSError naming ``path``."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        written = torch_write_error(err, tmp)
        Path(tmp).unlink(missing_ok=True)
        if written is not None:
            raise OSError(written.errno, f"{path}: not written ({written.strerror or written})") from None
        raise


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save``, atomically (:func:`_atomic_write_with`)."""
    import torch

    _atomic_write_with(path, lambda tmp: torch.save(obj, tmp))


@functools.cache
def code_version() -> str:
    """The git commit of the code (with '+dirty' when the tree has changes), or 'unknown'.
    Worked out once per process: the code that is running, even if the tree changes later."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_safetensors(path: str | Path, tensors: dict, metadata: dict[str, str]) -> None:
    """Write ``tensors`` (name -> tensor) and string ``metadata`` as a safetensors file, atomically
    (:func:`_atomic_write_with`: a full disk is one OSError naming the file, as for torch.save)."""
    from safetensors.torch import save_file

    def write(tmp):
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp, metadata=metadata)
        os.chmod(tmp, 0o666 & ~current_umask())  # safetensors writes the file anew, owner-only

    _atomic_write_with(path, write)


# numpy arrays, which checkpoints written before the safe format held (numpy's RNG state). Rebuilding
# one calls numpy's own array constructor on an allow-listed class and dtype: no other code runs.
LEGACY_NUMPY_GLOBALS = ("numpy.ndarray", "numpy._core.multiarray._reconstruct", "numpy.dtype",
                        "numpy.dtypes.UInt32DType")


def _numpy_globals() -> list:
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [np.ndarray, _reconstruct, np.dtype, type(np.dtype(np.uint32))]


def unsafe_load_message(path: str | Path, err: BaseException) -> str:
    """The one-line refusal for a file the safe unpickler will not load."""
    text = str(err)
    found = re.search(r"GLOBAL (\S+)", text)
    if found:
        why = found.group(1)
    else:
        tail = text.split("WeightsUnpickler error:", 1)[-1]
        lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
        why = lines[0][:200] if lines else type(err).__name__
    return f"{path}: not a safe weights file (it needs code to load: {why}); refusing to load it"


def is_unsafe_load_error(err: BaseException) -> bool:
    import pickle

    return isinstance(err, pickle.UnpicklingError) and ("Weights only load failed" in str(err)
                                                       or "WeightsUnpickler" in str(err))


def safe_torch_load(path: str | Path, *, mmap: bool = False, legacy_numpy: bool = False) -> Any:
    """``torch.load`` with torch's safe unpickler (``weights_only=True``): tensors and plain
    Python values only, so loading never runs code that a file carries. ``legacy_numpy`` also
    accepts plain numpy arrays (checkpoints written before RNG states were stored as tensors).

    A file the safe unpickler refuses fails with a one-line ConfigError naming it; so does a
    truncated or corrupt one."""
    import contextlib

    import torch

    allow = torch.serialization.safe_globals(_numpy_globals()) if legacy_numpy else contextlib.nullcontext()
    try:
        with allow:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - every failure becomes one line naming the file
        if is_unsafe_load_error(err):
            raise ConfigError(unsafe_load_message(path, err)) from None
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path}: cannot be read ({type(err).__name__}: {first})") from None


def read_safetensors(path: str | Path, tensors: bool = True) -> tuple[dict | None, dict[str, str]]:
    """(name -> tensor, or None when ``tensors`` is false: only the header is read; the metadata)
    of a safetensors file. No unpickler is involved; a truncated or corrupt file is one line naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            metadata = fh.metadata() or {}
            return ({k: fh.get_tensor(k) for k in fh.keys()} if tensors else None), metadata
    except (SafetensorError, OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path}: cannot be read ({type(err).__name__}: {first})") from None
