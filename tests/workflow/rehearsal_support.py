"""Rehearsals from tests: run one config's rehearsal once per session, and Snakemake in its folder."""

import os
import subprocess
import sys
import time
from pathlib import Path

from dag_helpers import ROOT, env

SHARED = Path(os.environ.get("STATELOOP_SHARED", ROOT.parent / "shared")) / "data"
_REHEARSALS: dict[str, tuple[Path, subprocess.CompletedProcess, float]] = {}


def rehearse(config: str, out: Path, *snakemake_args, timeout: int = 1500) -> subprocess.CompletedProcess:
    """``stateloop rehearse configs/CONFIG --out OUT [-- SNAKEMAKE_ARGS]`` in a subprocess."""
    args = [sys.executable, "-m", "stateloop.cli", "rehearse", f"configs/{config}", "--out", str(out), "--cores", "2"]
    if snakemake_args:
        args += ["--", *snakemake_args]
    return subprocess.run(args, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def rehearsed(config: str, tmp_path_factory) -> Path:
    """The folder of ``config``'s rehearsal, its whole DAG run once per session."""
    if config not in _REHEARSALS:
        out = tmp_path_factory.mktemp("rehearsal") / Path(config).stem
        t0 = time.perf_counter()
        proc = rehearse(config, out)
        _REHEARSALS[config] = (out, proc, time.perf_counter() - t0)
        print(f"\nrehearsal of {config}: {_REHEARSALS[config][2]:.0f} s", file=sys.stderr)
    out, proc, _ = _REHEARSALS[config]
    assert proc.returncode == 0, f"rehearsal of {config} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out


def dag(out: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """Snakemake in a rehearsal folder, as ``stateloop rehearse`` runs it (its env, its config)."""
    from stateloop.rehearse.run import environment, snakemake_command

    return subprocess.run(snakemake_command(out, 1, list(args)), env=environment(out), capture_output=True,
                          text=True, timeout=timeout)
