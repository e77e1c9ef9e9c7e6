"""A small real file system to fill: a tmpfs of a few KiB, mounted where a test writes (needs root;
the test skips, saying why, elsewhere)."""

import subprocess

import pytest


def mount_tmpfs(path, size: int) -> None:
    """Mount a tmpfs of ``size`` bytes at ``path`` (made if missing); unmount it with ``umount``."""
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {proc.stderr.strip()}")
