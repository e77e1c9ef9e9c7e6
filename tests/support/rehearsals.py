"""Rehearsals from tests: run one config's rehearsal once per session, and Snakemake in its folder."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from stateloop.config.evaluate import PAPER_TASKS
from stateloop.evaluate.tasks.files import default_shared_data
from support.dag import ROOT, env

SHARED = default_shared_data()
# Seconds for one rehearsal, from its start (both run side by side, beside the rest of the suite).
# On 2026-12-02 a fresh-clone CI on this 2-core machine took over 1800 s for the tiny rehearsal
# (80 jobs, at 70 of them) while the landed CI before it had run whole in 1026 s: a hang guard, not a
# target, with room for a machine of one core or a slower one (the rehearsals run with --cores 2 anywhere).
TIMEOUT = 5400


@dataclass
class Rehearsal:
    out: Path
    proc: subprocess.Popen
    started: float
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""


_REHEARSALS: dict[str, Rehearsal] = {}


def rehearse_args(config: str, out: Path, *snakemake_args) -> list[str]:
    """``stateloop rehearse configs/CONFIG --out OUT [-- SNAKEMAKE_ARGS]``."""
    args = [sys.executable, "-m", "stateloop.cli", "rehearse", f"configs/{config}", "--out", str(out), "--cores", "2"]
    return args + (["--", *snakemake_args] if snakemake_args else [])


def start(config: str, tmp_path_factory) -> None:
    """Start ``config``'s rehearsal in the background (once per session); its output goes to
    files beside its folder, so several can run side by side without filling a pipe."""
    if config in _REHEARSALS:
        return
    out = tmp_path_factory.mktemp("rehearsal") / Path(config).stem
    with open(out.parent / "stdout", "w") as so, open(out.parent / "stderr", "w") as se:
        proc = subprocess.Popen(rehearse_args(config, out), cwd=ROOT, env=env(), stdout=so, stderr=se, text=True,
                                start_new_session=True)
    _REHEARSALS[config] = Rehearsal(out, proc, time.perf_counter())


def rehearsed(config: str, tmp_path_factory) -> Path:
    """The folder of ``config``'s rehearsal, its whole DAG run once per session (started here
    unless tests/workflow/conftest.py started it with the others at the session's start)."""
    start(config, tmp_path_factory)
    r = _REHEARSALS[config]
    if r.returncode is None:
        try:
            r.returncode = r.proc.wait(timeout=max(1.0, TIMEOUT - (time.perf_counter() - r.started)))
        except subprocess.TimeoutExpired:
            os.killpg(r.proc.pid, signal.SIGKILL)
            r.returncode = r.proc.wait()
            r.stderr = f"timed out after {TIMEOUT} s\n"
        r.stdout = (r.out.parent / "stdout").read_text()
        r.stderr += (r.out.parent / "stderr").read_text()
        print(f"\nrehearsal of {config}: {time.perf_counter() - r.started:.0f} s", file=sys.stderr)
    assert r.returncode == 0, f"rehearsal of {config} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.out


def needs_shared_data(raw: dict) -> bool:
    """A config whose rehearsal reads ../shared/data: a scale's hub dataset or tokenizer, or an
    lm-eval task of a scale whose runs are trained (rehearse/run.py writes tasks only for those:
    Table 3's untrained shapes have a scale whose tasks no job reads)."""
    from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, task_yamls
    from stateloop.experiments import expand_runs, pipeline_from_dict

    local_tasks = set(task_yamls(DEFAULT_TASK_DIR))
    trained = {run.scale for run in expand_runs(pipeline_from_dict(raw))}
    for name, scale in raw["scales"].items():
        data, ev = scale.get("data") or {}, scale.get("eval") or {}
        if data.get("source", "synthetic") != "synthetic" or data.get("tokenizer", "bpe") != "bpe":
            return True
        if name in trained and any(t not in local_tasks for t in ev.get("tasks", PAPER_TASKS)):
            return True
    return False


def dag(out: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """Snakemake in a rehearsal folder, as ``stateloop rehearse`` runs it (its env, its config)."""
    from stateloop.ops.rehearse.run import environment, snakemake_command

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
        deadline = time.time() + 300  # a hang guard: the server imports MLflow and migrates the store first
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.read().decode().strip() == "OK":
                        break
            except OSError:
                pass
            assert server.poll() is None, f"MLflow server exited with {server.returncode}"
            assert time.time() < deadline, "MLflow server did not come up in 300 s"
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
