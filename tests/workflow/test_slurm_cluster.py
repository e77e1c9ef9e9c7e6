"""Training under SLURM: the warning before the time limit reaches the trainer, which checkpoints
and requeues its job; the job resumes as many times as it needs.

Without a cluster (the whole suite): the signal bookkeeping of train/signals.py, and `stateloop
train` as a job step under the rehearsals' srun stand-in, with SIGUSR1 sent to the task process
the way slurmstepd delivers it and a stand-in `scontrol` that records the requeue.

With one (marked `slurm`): a one-node cluster on this machine (scripts/slurm-cluster.sh) runs a
slice of the smoke DAG (tokenize, one training, its eval) through the
project's own `--profile slurm`, and the training job is stopped twice the ways SLURM stops jobs:
its warning before the time limit, SIGUSR1 to the job's steps (`scancel --signal=USR1` takes the
path `--signal=USR1@N` takes: to every job step, never the batch script), and `scontrol requeue`
(what preemption does: SIGTERM to the whole job, then a restart). Training checkpoints each time,
the job is requeued (by the trainer, then by SLURM) and resumes, and the DAG finishes with
`--retries 0`: no attempt failed. It needs `bash scripts/slurm-cluster.sh` (root,
Debian/Ubuntu: apt-get install, then three daemons on loopback) and is skipped without SLURM's
commands; about 3 minutes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from stateloop.train import signals as train_signals
from stateloop.train import slurm
from support.dag import ROOT, copy_workflow, env

RUN = "smoke/vanilla_looped/K2_ds0_seed1234"
STEPS = 300  # ~10 s of training on one CPU: long enough to be stopped twice in its first 100 steps


def _complete_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in (run_dir / "checkpoints").glob("step_*.ckpt.sha256"))


def _wait(what: str, predicate, proc, log: Path, timeout: float = 300.0, every: float = 0.1):
    """Poll ``predicate`` every ``every`` seconds (0.5 where it asks SLURM's controller: each call
    is a process and an RPC, on a machine whose cores the rest of the suite is using)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"snakemake exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(every)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


# ----------------------------------------------------------------------------------------------
# Without a cluster


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """`scontrol` first on PATH: records its arguments; exits with $SCONTROL_RC (default 0)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                      f'[ "${{SCONTROL_RC:-0}}" = 0 ] || {{ echo "Requeue of JobId=$2 is disabled" >&2; exit $SCONTROL_RC; }}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def _wait_for(predicate, timeout=60.0):  # a hang guard: the hand-over thread polls every 0.05 s
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_a_warning_before_the_loop_listens_is_kept_for_it_and_everything_is_restored():
    """SIGUSR1 ends a Python process that has no handler: one that arrives while the command is
    still starting (SLURM may send the warning up to 60 s early) is kept, and handed to the
    training loop's handler once it is installed."""
    old_fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(old_fd)
    loop_got = []
    with train_signals.SignalLog() as signals:
        os.kill(os.getpid(), signal.SIGUSR1)  # would end this pytest process without the log
        time.sleep(0.05)
        assert signals.got(signal.SIGUSR1) and not signals.got(signal.SIGTERM)
        previous = signal.signal(signal.SIGUSR1, lambda s, f: loop_got.append(s))  # the loop starts listening
        _wait_for(lambda: loop_got)
        signal.signal(signal.SIGUSR1, previous)  # the loop restores what it found
    assert loop_got == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.set_wakeup_fd(old_fd) == old_fd  # the wakeup fd is the one before


def test_signals_that_the_loops_own_handler_takes_are_recorded():
    with train_signals.SignalLog() as signals:
        previous = signal.signal(signal.SIGTERM, lambda s, f: None)  # the loop's handler
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        finally:
            signal.signal(signal.SIGTERM, previous)
    assert signals.got(signal.SIGTERM) and not signals.got(signal.SIGUSR1)


def _log_with(*sigs) -> train_signals.SignalLog:
    log = train_signals.SignalLog()
    log.received = list(sigs)
    return log


def test_requeue_only_on_slurms_warning_inside_a_slurm_job(fake_scontrol, monkeypatch, capsys):
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    assert not train_signals.requeue_after_warning(_log_with(signal.SIGUSR1), 20)  # not a SLURM job
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    assert not train_signals.requeue_after_warning(_log_with(signal.SIGTERM), 20)  # scancel, time limit, preemption
    monkeypatch.setenv(slurm.REQUEUE_ENV, "0")
    assert not train_signals.requeue_after_warning(_log_with(signal.SIGUSR1), 20)  # turned off
    assert not fake_scontrol.exists()
    monkeypatch.delenv(slurm.REQUEUE_ENV)
    assert train_signals.requeue_after_warning(_log_with(signal.SIGTERM, signal.SIGUSR1), 20)
    assert fake_scontrol.read_text() == "requeue 123\n"
    assert "SIGUSR1 in SLURM job 123: requeueing it (scontrol requeue 123) (it resumes from step 20)" in capsys.readouterr().err
    monkeypatch.setenv("SCONTROL_RC", "1")  # a cluster whose jobs are not requeueable
    assert not train_signals.requeue_after_warning(_log_with(signal.SIGUSR1), 20)
    err = capsys.readouterr().err
    assert "scontrol requeue 123 failed (Requeue of JobId=123 is disabled): not requeued" in err


def test_auto_accelerator_without_a_gpu_in_a_slurm_job_says_so(monkeypatch, capsys):
    """The other half of "accelerator: auto trains on CPU silently" (the job now asks for GPUs)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    slurm.warn_cpu_fallback("cpu")  # meant
    assert capsys.readouterr().err == ""
    slurm.warn_cpu_fallback("auto")
    assert "train.accelerator: auto found no GPU in SLURM job 55: training on the CPU" in capsys.readouterr().err
    monkeypatch.delenv("SLURM_JOB_ID")
    slurm.warn_cpu_fallback("auto")  # outside SLURM: auto means either
    assert capsys.readouterr().err == ""


def _train_support():
    from support import training

    return training


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.slow
def test_warning_to_the_job_step_while_it_starts_checkpoints_and_requeues(tmp_path, fake_scontrol):
    """`stateloop train` as a job step (the srun stand-in sets SLURM's variables): SIGUSR1 goes to
    the task process itself, as slurmstepd delivers --signal=USR1@N, while the command is still
    importing torch; it is not killed: training stops at its first step boundary with a complete
    checkpoint, the first task requeues the job, and the step exits with 75."""
    ts = _train_support()
    data = ts.write_shards(tmp_path / "data")
    cfg = ts.write_config(tmp_path / "cfg.yaml", train={"max_steps": 5000, "checkpoint_every": 1000})
    srun = fake_scontrol.parent / "bin" / "srun"
    srun.write_text(f"#!/bin/sh\nexec {sys.executable} -m stateloop.ops.rehearse.srun \"$@\"\n")
    srun.chmod(0o755)
    run_dir = tmp_path / "run"
    child_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "4242",
                 "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    proc = subprocess.Popen(["srun", "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=1", sys.executable, "-m", "stateloop.cli",
                             "train", "--config", str(cfg), "t/vanilla_looped/K2_ds0_seed1234", "--data-dir", str(data),
                             "--out", str(run_dir), "--no-progress"],
                            env=child_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        task = None
        deadline = time.time() + 600  # a hang guard: the task imports torch before it listens
        while task is None or not _catches(task, signal.SIGUSR1):  # the command has started listening
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timed out"
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            task = int(pids[0]) if pids else None
            time.sleep(0.005)
        assert not (run_dir / "checkpoints").exists()  # training has not started yet
        os.kill(task, signal.SIGUSR1)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    steps = re.findall(r"SIGUSR1: checkpoint \S+ written at step (\d+)", err)
    assert steps and int(steps[0]) < 1000, err[-3000:]  # at the first step boundaries, not the periodic checkpoint
    assert fake_scontrol.read_text() == "requeue 4242\n", err[-3000:]
    assert "SIGUSR1 in SLURM job 4242: requeueing it" in err


# The ranks of a job step in which rank 0 fails (at a checkpoint write, say) while rank 1 waits in a
# collective: it never notices the failure (NCCL does not), and its Python SIGTERM handler cannot
# run while it is blocked in C++ (here: SIGTERM ignored). Only the launcher can end it.
FAILING_STEP = textwrap.dedent("""
    import os, signal, sys, time
    rank, marker = int(os.environ["SLURM_PROCID"]), sys.argv[1]
    if rank == 0:
        while not os.path.exists(marker + ".1"):  # rank 1 is waiting
            time.sleep(0.05)
        sys.exit(3)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(marker + f".{rank}", "w").write(str(os.getpid()))
    time.sleep(600)
    open(marker + ".survived", "w").close()
""")


def _launcher(tmp_path: Path, monkeypatch) -> list[str]:
    """The words before `stateloop train` in the train rule's command inside a SLURM job (one node,
    two tasks on the CPU): the launcher every SLURM training starts with."""
    work = copy_workflow(tmp_path / "work")
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    cfg["scales"]["smoke"]["train"].update(accelerator="cpu", devices=2, num_nodes=1)
    (work / "two.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    out = subprocess.run([sys.executable, "-m", "snakemake", "--mode", "remote", "-n", "-p",
                          f"results/runs/{RUN}/model.safetensors", "--configfile", "two.yaml"],
                         cwd=work, env=env(), capture_output=True, text=True, timeout=600)
    line = next((line for line in out.stdout.splitlines() if " stateloop train " in line), None)
    assert line, out.stdout[-3000:] + out.stderr[-3000:]
    words = line.split(" stateloop train ")[0].split()
    return words[words.index("srun"):]


def _run_failing_step(launcher: list[str], tmp_path: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "step.py"
    script.write_text(FAILING_STEP)
    proc = subprocess.run([*launcher, sys.executable, str(script), str(tmp_path / "rank")], cwd=tmp_path,
                          env={**os.environ, **(extra_env or {})}, capture_output=True, text=True,
                          timeout=300)  # a hang guard: without the launcher's kill, rank 1 sleeps 600 s
    return proc


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_the_training_launcher_ends_every_rank_when_one_fails(tmp_path, monkeypatch):
    """The train rule's srun (`--kill-on-bad-exit=1`), run by the rehearsals' stand-in: rank 0 exits
    with 3 while rank 1 sits in a "collective"; the step ends at once with rank 0's status, rank 1
    killed (SIGTERM, then SIGKILL after KillWait, 1 s here), instead of waiting for the process
    group's timeout."""
    launcher = _launcher(tmp_path, monkeypatch)
    assert launcher[:2] == ["srun", "--kill-on-bad-exit=1"], launcher
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f"#!/bin/sh\nexec {sys.executable} -m stateloop.ops.rehearse.srun \"$@\"\n")
    (bin_dir / "srun").chmod(0o755)
    proc = _run_failing_step(launcher, tmp_path, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                                                  "STATELOOP_SRUN_KILL_WAIT": "1"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    pid = int((tmp_path / "rank.1").read_text())
    assert not _alive(pid) and not (tmp_path / "rank.survived").exists()


@pytest.mark.slow
def test_a_warning_to_a_two_rank_step_under_kill_on_bad_exit_still_requeues(tmp_path, fake_scontrol):
    """Two ranks under the launcher's `srun --kill-on-bad-exit=1` (the stand-in): SLURM's warning
    reaches both, both write the checkpoint, rank 0 requeues the job and exits 75, and rank 1 exits
    0: a non-zero exit of rank 1 would end the step, and rank 0 with it, before the requeue
    wherever rank 1 ends first (with NCCL it need not wait for rank 0; over gloo here it does)."""
    ts = _train_support()
    data = ts.write_shards(tmp_path / "data")
    cfg = ts.write_config(tmp_path / "cfg.yaml", train={"num_nodes": 2, "max_steps": 5000, "checkpoint_every": 1000})
    srun = fake_scontrol.parent / "bin" / "srun"
    srun.write_text(f"#!/bin/sh\nexec {sys.executable} -m stateloop.ops.rehearse.srun \"$@\"\n")
    srun.chmod(0o755)
    run_dir = tmp_path / "run"
    child_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "4343",
                 "STATELOOP_SRUN_KILL_WAIT": "5", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    wrapper = tmp_path / "status.py"  # each task: the command, signals passed on, its exit status recorded
    wrapper.write_text(textwrap.dedent("""
        import os, signal, subprocess, sys
        proc = subprocess.Popen(sys.argv[2:])
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, lambda n, _: proc.send_signal(n))
        status = proc.wait()
        open(f"{sys.argv[1]}.{os.environ['SLURM_PROCID']}", "w").write(str(status))
        sys.exit(status)
    """))
    proc = subprocess.Popen(["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1",
                             sys.executable, str(wrapper), str(tmp_path / "status"),
                             sys.executable, "-m", "stateloop.cli", "train", "--config", str(cfg),
                             "t/vanilla_looped/K2_ds0_seed1234", "--data-dir", str(data), "--out", str(run_dir),
                             "--no-progress"],
                            env=child_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600  # a hang guard: two tasks import torch and meet over gloo
        while not list(run_dir.glob("config.yaml")):  # both ranks are in the training (past setup's collectives)
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "timed out"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGUSR1)  # the stand-in forwards it to every task, as SLURM signals every step task
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, err[-3000:]
    assert re.search(r"SIGUSR1: checkpoint \S+ written at step \d+", err), err[-3000:]
    assert fake_scontrol.read_text() == "requeue 4343\n", err[-3000:]
    assert [(tmp_path / f"status.{rank}").read_text().strip() for rank in (0, 1)] == ["75", "0"]


def _processes(cwd: Path, *words: str) -> list[int]:
    """Processes running in ``cwd`` whose command line has every one of ``words``."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if Path(os.readlink(proc / "cwd")) == cwd and all(w.encode() in argv for w in words):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_retry_keeps_the_interrupted_attempts_training_log(tmp_path):
    """Issue: "a retry truncates the interrupted attempt's training log (`> {log}`), losing its
    checkpoint/exit line". Locally with `--retries 1`: the first attempt is stopped by SIGTERM after
    its first checkpoint (exit 75), the retry resumes; the rule's log holds both attempts."""
    work = copy_workflow(tmp_path / "work")
    (work / "slice.yaml").write_text(yaml.safe_dump(
        {"scales": {"smoke": {"train": {"max_tokens": 400 * 512, "checkpoint_every": 10, "val_every": 400}}}}))
    target = "results/runs/" + RUN + "/model.safetensors"
    log = tmp_path / "snakemake.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "snakemake", target, "--cores", "1", "--retries", "1",
                                 "--configfile", "configs/smoke.yaml", "slice.yaml"],
                                cwd=work, env=env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    run_dir = work / "results/runs" / RUN
    try:
        _wait("a first checkpoint", lambda: _complete_steps(run_dir), proc, log)
        (trainer,) = _processes(work, "train", RUN)
        os.kill(trainer, signal.SIGTERM)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-4000:]
    assert "Trying to restart job" in log.read_text()  # the first attempt failed (75) and was retried
    rule_log = (work / "logs/train" / f"{RUN}.log").read_text()
    stop = re.search(r"SIGTERM: checkpoint \S+ written at step (\d+); exiting with status 75", rule_log)
    assert stop, rule_log[-3000:]
    assert f"(step {stop.group(1)} of 400" in rule_log[stop.end():] and rule_log.rstrip().endswith(str(run_dir.relative_to(work)))
    assert (run_dir / "train.log").read_text() == rule_log


# ----------------------------------------------------------------------------------------------
# A real cluster


@pytest.fixture(scope="module")
def cluster():
    if not (shutil.which("sinfo") and shutil.which("slurmctld") and shutil.which("sbatch")):
        pytest.skip("no SLURM on this machine: `bash scripts/slurm-cluster.sh` (as root, Debian/Ubuntu) installs "
                    "and starts a one-node cluster")
    script = ROOT / "scripts" / "slurm-cluster.sh"
    was_up = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if not was_up:
        if os.geteuid() != 0:
            pytest.skip("the one-node SLURM cluster is not up, and starting it needs root: `bash scripts/slurm-cluster.sh`")
        proc = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"the one-node SLURM cluster did not start: {proc.stderr.strip()[-500:]}")
    yield
    if not was_up:  # leave the machine as it was
        subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)


@pytest.mark.slurm
def test_the_training_launcher_ends_every_rank_when_one_fails_on_the_cluster(cluster, tmp_path, monkeypatch):
    """As test_the_training_launcher_ends_every_rank_when_one_fails, with SLURM's own srun: the step
    ends with rank 0's failure, rank 1 killed after the cluster's KillWait (10 s in
    scripts/slurm-cluster.sh), not after its 600 s."""
    launcher = _launcher(tmp_path, monkeypatch)
    assert launcher[:2] == ["srun", "--kill-on-bad-exit=1"], launcher
    # The rule's srun runs inside the job SLURM allocated (one node, two tasks, as the profile asks for
    # devices=2): salloc makes that allocation and sets the job's variables, replacing _launcher's stand-in id.
    monkeypatch.delenv("SLURM_JOB_ID")
    proc = _run_failing_step(["salloc", "--nodes=1", "--ntasks=2", "--cpus-per-task=1", *launcher], tmp_path)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert (tmp_path / "rank.1").exists() and not (tmp_path / "rank.survived").exists(), proc.stderr[-2000:]
    assert not _alive(int((tmp_path / "rank.1").read_text()))


def _squeue(job: str, fmt: str) -> str:
    return subprocess.run(["squeue", "--states=all", "-h", "-j", job, "-o", fmt], capture_output=True, text=True).stdout.strip()


def _restarts(job: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    m = re.search(r"Restarts=(\d+)", out)
    return int(m.group(1)) if m else -1


def _train_job(log: Path) -> str | None:
    """The SLURM job id of the running training job of this Snakemake run (its jobs are named
    after the run's id, which the plugin logs)."""
    run_id = re.search(r"SLURM run ID: (\S+)", log.read_text())
    if not run_id:
        return None
    out = subprocess.run(["squeue", "--states=all", "-h", "--name", run_id.group(1), "-o", "%i|%k|%T"],
                         capture_output=True, text=True).stdout
    return next((job for job, comment, state in (line.split("|") for line in out.splitlines())
                 if comment.startswith("rule_train") and state == "RUNNING"), None)


@pytest.mark.slurm
@pytest.mark.slow
def test_training_job_is_warned_requeued_and_resumes_without_a_retry(cluster, tmp_path):
    """See the module's docstring: the smoke slice through `--profile slurm`, stopped by SIGUSR1
    to its steps, then by `scontrol requeue`, finishes with `--retries 0`."""
    work = copy_workflow(tmp_path / "work")
    # The smoke config with Table 1 cut to one run, evaluated on held-out text only (no lm-eval
    # tasks: 10 s instead of 30), and trained longer, with a checkpoint every 10 steps. The target
    # is that run's eval.json: the table's render is a local rule, which this test does not need.
    slice_cfg = {"experiments": {"table1": {"models": ["vanilla_looped"]}},
                 "scales": {"smoke": {"eval": {"tasks": []},
                                      "train": {"max_tokens": STEPS * 512, "checkpoint_every": 10, "val_every": STEPS}}}}
    (work / "slice.yaml").write_text(yaml.safe_dump(slice_cfg))  # merged over configs/smoke.yaml
    # No accounting on this cluster: the profile's own line for that case, uncommented as it says.
    profile = work / "profiles/slurm/config.yaml"
    assert "\n# slurm-status-command: squeue\n" in profile.read_text()
    profile.write_text(profile.read_text().replace("\n# slurm-status-command: squeue\n", "\nslurm-status-command: squeue\n"))
    log = tmp_path / "snakemake.log"
    cmd = [sys.executable, "-m", "snakemake", f"results/runs/{RUN}/eval.json", "--profile", "slurm",
           "--retries", "0",                                  # any failed attempt fails the DAG
           "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "1",
           "--configfile", "configs/smoke.yaml", "slice.yaml"]
    run_dir = work / "results/runs" / RUN
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        # 1. SLURM's warning: once training has written a checkpoint, SIGUSR1 to the job's steps.
        _wait("a first checkpoint", lambda: _complete_steps(run_dir), proc, log)
        job = _wait("the training job in squeue", lambda: _train_job(log), proc, log, timeout=30, every=0.5)
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        _wait("the requeued job to restart", lambda: _restarts(job) == 1 and _squeue(job, "%T") == "RUNNING", proc, log,
              timeout=120, every=0.5)
        first_stop = _wait("the first stop's checkpoint", lambda: re.findall(r"SIGUSR1: checkpoint \S+ written at step (\d+)",
                                                                            (run_dir / "train.log").read_text()), proc, log, 60)
        stop1 = int(first_stop[-1])

        # 2. A requeue from outside (preemption): SIGTERM to the whole job once it trains again.
        _wait("a checkpoint after the resume", lambda: [s for s in _complete_steps(run_dir) if s > stop1], proc, log)
        subprocess.run(["scontrol", "requeue", job], check=True)
        proc.wait(timeout=420)
    finally:
        if proc.poll() is None:  # a failure above: Snakemake cancels its SLURM jobs on Ctrl-C
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    elapsed = time.time() - t0
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]

    # Two restarts of the same SLURM job, no Snakemake retry, and the run's evaluation.
    assert _restarts(job) == 2, subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Trying to restart" not in text and "Error in rule" not in text
    assert (run_dir / "eval.json").is_file()

    # The three attempts, in the run folder's log and in the rule's log (kept across attempts).
    history = (run_dir / "train.log").read_text()
    assert f"SIGUSR1 in SLURM job {job}: requeueing it" in history, history[-3000:]
    assert "SIGTERM: checkpoint" in history, history[-3000:]
    resumed = [int(s) for s in re.findall(r"resuming from \S+ \(step (\d+) of", history)]
    assert len(resumed) == 2 and resumed[0] == stop1 and resumed[1] > stop1, history[-3000:]
    summary = json.loads((run_dir / "train.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from_step"] == resumed[1]
    rule_log = (work / "logs/train" / f"{RUN}.log").read_text()
    assert rule_log == history

    # The job's SLURM log was appended to, not truncated, by each restart (--open-mode=append).
    slurm_log = next((work / ".snakemake/slurm_logs/rule_train").rglob(f"{job}.log")).read_text()
    assert slurm_log.count("DUE TO JOB REQUEUE") == 2, slurm_log[-3000:]
    # The profile keeps SLURM's logs of the jobs that succeeded too (slurm-keep-successful-logs).
    for rule in ("tokenize", "eval"):
        assert list((work / f".snakemake/slurm_logs/rule_{rule}").rglob("*.log")), rule
    print(f"SLURM slice: {elapsed:.0f} s")
