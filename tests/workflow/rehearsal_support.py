"""Rehearsals from tests: run one config's rehearsal once per session, and Snakemake in its folder."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from dag_helpers import ROOT, env

from stateloop.evaluate.task_files import default_shared_data

SHARED = default_shared_data()
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


@contextmanager
def mlflow_server(folder: Path):
    """`mlflow server` on a free loopback port over a rehearsal's results/mlflow.db (artifacts in its
    mlartifacts/); yields the base URL once /health answers, stops the server after."""
    db = folder / "results" / "mlflow.db"
    assert db.is_file(), db
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--default-artifact-root", str(folder / "mlartifacts")],
        cwd=folder, env={**env(), "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.read().decode().strip() == "OK":
                        break
            except OSError:
                pass
            assert server.poll() is None, f"MLflow server exited with {server.returncode}"
            assert time.time() < deadline, "MLflow server did not come up in 120 s"
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
