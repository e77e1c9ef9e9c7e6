"""Warm starts (stateloop/ops/warm.py): a `stateloop` command served by a child of the warm server is
the command run in a fresh process: the same weights bit for bit, the same output, exit status and
signals; a request the child could not stand for runs in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stateloop.ops import warm
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import REQUEUE_EXIT
from support.training import ROOT, assert_bitwise_equal, weights, write_config, write_shards

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm starts are Linux only")
RUN = "t/stateloop/K2_ds32_seed1234"


def cli(args: list[str], cwd: Path, env_extra: dict | None = None) -> subprocess.Popen:
    """``python -m stateloop.cli ...`` as support.training's ``cli`` runs it, less pytest's variable
    naming the current test (which the server, started once for the module, could not match)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1", **(env_extra or {}))
    return subprocess.Popen([sys.executable, "-m", "stateloop.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A warm server started as the Snakefile's onstart starts it, in a folder with tiny shards and
    config; yields (folder, server log). The commands' environment is what `cli` gives them."""
    home = tmp_path_factory.mktemp("warm")
    write_shards(home / "data")
    write_config(home / "cfg.yaml")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "OMP_NUM_THREADS", "MLFLOW_TRACKING_URI")}
    os.environ.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("PYTEST_CURRENT_TEST", None)  # pytest sets it again for each test
    cwd = os.getcwd()
    os.chdir(home)
    log = home / "warm.log"
    try:
        proc = warm.start(log)  # returns once the server listens: the DAG's first jobs are served too
        assert proc.poll() is None, log.read_text()
        assert os.path.exists(os.environ[warm.ENV]), log.read_text()
        yield home, log
    finally:
        os.chdir(cwd)
        warm.stop(proc)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert proc.returncode is not None


def _train_args(home: Path, out: str, *extra: str) -> list[str]:
    return ["train", "--config", "cfg.yaml", RUN, "--data-dir", "data", "--out", out, "--no-progress", "--set",
            f"train.mlflow_tracking_uri=sqlite:///{home}/mlflow.db", *extra]


def _entries(log: Path, kind: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if kind in line]


@pytest.mark.slow
def test_a_served_training_is_bitwise_the_fresh_process(served):
    home, log = served
    fresh = cli(_train_args(home, "fresh"), cwd=home, env_extra={warm.ENV: "off"})
    out_fresh, err_fresh = fresh.communicate(timeout=300)
    assert fresh.returncode == 0, err_fresh
    n = len(_entries(log, "started: train"))
    proc = cli(_train_args(home, "served"), cwd=home)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert len(_entries(log, "started: train")) == n + 1, "the command was not served"
    assert_bitwise_equal(weights(home / "served"), weights(home / "fresh"))
    # the job's own output reaches the command's streams (the summary line names its run folder)
    assert out.replace("served", "X").split(", ")[:4] == out_fresh.replace("fresh", "X").split(", ")[:4]
    assert "stateloop train: step 12/12" in err
    fresh_summary = json.loads((home / "fresh" / "train.json").read_text())
    served_summary = json.loads((home / "served" / "train.json").read_text())
    assert served_summary["val_curve"] == fresh_summary["val_curve"]


@pytest.mark.slow
def test_errors_and_exit_status_pass_through(served):
    home, log = served
    args = ["train", "--config", "missing.yaml", RUN, "--data-dir", "data", "--out", "x"]
    fresh = cli(args, cwd=home, env_extra={warm.ENV: "off"})
    proc = cli(args, cwd=home)
    assert (proc.communicate(timeout=120), proc.returncode) == (fresh.communicate(timeout=120), fresh.returncode)
    assert proc.returncode == 2
    assert any('"exit": 2' in line for line in _entries(log, "ended"))


def test_sigterm_reaches_the_served_job(served):
    """The train command answers SIGTERM with a complete checkpoint and exit status 75 (requeue):
    sent to the command's process, it reaches the job in the server's child."""
    home, _ = served
    proc = cli(_train_args(home, "term", "train.max_steps=400", "train.checkpoint_every=4"), cwd=home)
    store = CheckpointStore(home / "term" / "checkpoints")
    _wait(lambda: any(store.sidecar(store.path(s)).is_file() for s in store.steps()) or proc.poll() is not None,
          180, "a checkpoint")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT, err
    assert not (home / "term" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_killed_command_stops_its_served_job(served):
    home, log = served
    proc = cli(_train_args(home, "killed", "train.max_steps=400", "train.checkpoint_every=4"), cwd=home)
    store = CheckpointStore(home / "killed" / "checkpoints")
    _wait(lambda: bool(store.steps()) or proc.poll() is not None, 180, "training to start")
    pid = int(_entries(log, "started: train")[-1].split()[1])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _wait(lambda: any(line.startswith(f"job {pid} ended") for line in log.read_text().splitlines()), 120,
          "the orphaned job to stop")
    ended = next(line for line in log.read_text().splitlines() if line.startswith(f"job {pid} ended"))
    assert f'"exit": {REQUEUE_EXIT}' in ended  # stopped as SIGTERM stops it, checkpoint written


@pytest.mark.slow
def test_a_command_with_another_environment_runs_in_its_own_process(served):
    home, log = served
    args = ["params", "--config", "cfg.yaml"]
    fresh = cli(args, cwd=home, env_extra={warm.ENV: "off"})
    other = cli(args, cwd=home, env_extra={"HF_HUB_OFFLINE": "1"})
    same = cli(args, cwd=home)
    expected = fresh.communicate(timeout=120)[0]
    assert fresh.returncode == 0 and expected.count("\n") > 4
    assert other.communicate(timeout=120)[0] == expected and other.returncode == 0
    assert same.communicate(timeout=120)[0] == expected and same.returncode == 0
    assert any("environment differs in HF_HUB_OFFLINE" in line for line in _entries(log, "refused"))
    assert _entries(log, "started: params")


def test_the_same_environment_through_a_symlinked_folder_is_served_and_its_base_python_is_not(served, tmp_path):
    """An interpreter is its environment: the venv reached through a link to its folder is served
    (a checkout whose .venv links to another's); the base Python the venv was made from is refused."""
    home, log = served
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite does not run in a virtual environment")
    link = tmp_path / "venv-link"
    link.symlink_to(sys.prefix, target_is_directory=True)
    args = ["-m", "stateloop.cli", "params", "--config", "cfg.yaml"]
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    before = len(_entries(log, "started: params"))
    linked = subprocess.run([str(link / "bin" / Path(sys.executable).name), *args], cwd=home, env=env,
                            capture_output=True, text=True, timeout=120)
    assert linked.returncode == 0, linked.stderr[-2000:]
    assert len(_entries(log, "started: params")) == before + 1
    base = subprocess.run([os.path.join(sys.base_prefix, "bin", "python3"), "-c", "from stateloop.ops import warm; "
                           "import sys; sys.argv = ['stateloop', 'params']; print(warm.delegate())"],
                          cwd=home, env=env, capture_output=True, text=True, timeout=120)
    assert base.stdout.strip() == "None", base.stderr[-2000:]  # refused: the command would run in its own process
    assert any(line.startswith("refused (interpreter") for line in _entries(log, "refused"))


@pytest.mark.slow
def test_a_job_step_task_is_served_where_it_runs_as_the_server_does(served):
    """An srun task's variables (SLURM_*, the rendezvous address) are read when a command runs, so
    such a request is served, as the rehearsals' stand-in srun sends it; a command pinned to other
    CPUs (as a real srun task, whose step has a cgroup of its own) runs in its own process."""
    home, log = served
    args = ["params", "--config", "cfg.yaml"]
    task = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29411"}
    before = len(_entries(log, "started: params"))
    expected = cli(args, cwd=home, env_extra={warm.ENV: "off"}).communicate(timeout=120)[0]
    served_task = cli(args, cwd=home, env_extra=task)
    assert served_task.communicate(timeout=120)[0] == expected and served_task.returncode == 0
    assert len(_entries(log, "started: params")) == before + 1
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to pin a command to one of them")
    pinned = subprocess.Popen(["taskset", "-c", str(cpus[0]), sys.executable, "-m", "stateloop.cli", *args], cwd=home,
                              env={k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert pinned.communicate(timeout=120)[0] == expected and pinned.returncode == 0
    assert len(_entries(log, "started: params")) == before + 1
    assert any("placement (cgroup or CPU affinity) differs" in line for line in _entries(log, "refused"))


@pytest.mark.slow
def test_the_server_stops_when_its_parent_is_gone_after_its_jobs(tmp_path):
    """Its parent (Snakemake) gone, the server takes no new job, waits for the job it runs, hands
    the command its status, and ends."""
    write_shards(tmp_path / "data")
    write_config(tmp_path / "cfg.yaml")
    parent = subprocess.Popen(["sleep", "600"])
    sock = tmp_path / "s"
    base = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "MLFLOW_TRACKING_URI")}
    base.update(PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    env = {**base, **warm.SERVER_ENV, "STATELOOP_WARM_BASE_ENV": json.dumps(base)}
    code = "import sys; del sys.path[0]; from stateloop.ops.warm import main; sys.exit(main())"
    server_log = tmp_path / "server.log"
    with open(server_log, "w") as log_file:
        server = subprocess.Popen([sys.executable, "-c", code, str(sock), str(parent.pid)], env=env, cwd=tmp_path,
                                  stdout=log_file, stderr=subprocess.STDOUT, text=True)
    _wait(lambda: sock.exists() or server.poll() is not None, 300, "the server to listen")
    assert server.poll() is None
    job = subprocess.Popen([sys.executable, "-m", "stateloop.cli", *_train_args(tmp_path, "run", "train.max_steps=200",
                           "train.checkpoint_every=25", "train.val_every=1000")],
                           cwd=tmp_path, env={**base, warm.ENV: str(sock)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    store = CheckpointStore(tmp_path / "run" / "checkpoints")
    _wait(lambda: bool(store.steps()) or job.poll() is not None, 180, "training to start")
    assert job.poll() is None
    (pid,) = [int(line.split()[1]) for line in server_log.read_text().splitlines() if " started: train " in line]
    # The job is held while its parent goes (the server looks once a second): on a fast machine
    # it could otherwise end first, and there would be no running job to wait for.
    os.kill(pid, signal.SIGSTOP)
    try:
        parent.kill()
        parent.wait()
        _wait(lambda: f"parent {parent.pid} is gone" in server_log.read_text() or server.poll() is not None, 120,
              "the server to see its parent gone")
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0 and (tmp_path / "run" / "model.safetensors").is_file(), err[-2000:]
    server.wait(timeout=60)
    log = server_log.read_text()
    assert server.returncode == 0, log
    assert f"parent {parent.pid} is gone: stopping after the 1 jobs running" in log, log
    assert '"exit": 0' in log.splitlines()[-1] and not sock.exists()
