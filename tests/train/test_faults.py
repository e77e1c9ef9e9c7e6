"""Faults while training ("Faults"): SIGKILL at several points of a checkpoint's life,
a disk that fills during a checkpoint write, Ctrl-C, and what each leaves behind; the progress
lines a non-interactive training prints."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from stateloop.cli import main
from stateloop.train import loop, signals
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import REQUEUE_EXIT, train
from support.disks import mount_tmpfs as _mount_tmpfs
from support.training import ROOT, assert_bitwise_equal, resolved, weights, write_config, write_shards

RUN = "t/stateloop/K2_ds32_seed1234"  # 12 steps, checkpoints at 4, 8, 12, two kept (support.training)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(config, data, uninterrupted run folder), the MLflow store of this module in the environment."""
    root = tmp_path_factory.mktemp("faults")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        cfg, data = write_config(root / "cfg.yaml"), write_shards(root / "data")
        assert train(resolved(cfg, data, RUN), root / "reference", progress=False).status == "finished"
        yield cfg, data, root / "reference"


def _args(cfg, data, run_dir, *overrides):
    return ["train", "--config", str(cfg), RUN, "--data-dir", str(data), "--out", str(run_dir),
            "--no-progress", "--set", *overrides]


KILLER = ROOT / "tests" / "support" / "killer.py"  # SIGKILLs itself at a point of a checkpoint's life


def _child_env():
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("point,at", [("mid-write", 8), ("before-rename", 8), ("before-sidecar", 8),
                                      ("mid-prune", 4), ("after-save", 4)])
@pytest.mark.slow
def test_sigkill_at_each_point_of_a_checkpoint_resumes_bitwise(setup, tmp_path, point, at, capsys):
    """The request: "SIGKILL at random points, including inside a checkpoint write: resume gives
    final weights bitwise equal to an uninterrupted run" and "A kill during checkpoint pruning
    leaves an orphan full checkpoint forever"."""
    cfg, data, reference = setup
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(KILLER), point, str(at), *_args(cfg, data, run_dir)],
                          env=_child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    store = CheckpointStore(run_dir / "checkpoints")
    leftovers = {p.name for p in store.dir.iterdir()} - {f"step_{s:08d}.ckpt{x}" for s in store.steps()
                                                         if store.verify(s) is None for x in ("", ".sha256")}
    expected_leftover = {"mid-write": ".step_00000008.ckpt.tmp", "before-rename": ".step_00000008.ckpt.tmp",
                         "before-sidecar": "step_00000008.ckpt", "mid-prune": "step_00000004.ckpt"}.get(point)
    assert leftovers == ({expected_leftover} if expected_leftover else set()), leftovers  # the kill hit where meant

    capsys.readouterr()
    assert main(_args(cfg, data, run_dir)) == 0  # the same command again
    err = capsys.readouterr().err
    assert_bitwise_equal(weights(run_dir), weights(reference))
    summary = json.loads((run_dir / "train.json").read_text())
    assert summary["resumed_from_step"] == {"mid-prune": 12, "after-save": 4}.get(point, 4)
    left = sorted(p.name for p in store.dir.iterdir())
    assert left == ["step_00000008.ckpt", "step_00000008.ckpt.sha256", "step_00000012.ckpt", "step_00000012.ckpt.sha256"], left
    if expected_leftover:
        assert f"removed 1 incomplete file(s) of interrupted writes: {expected_leftover}" in err


@pytest.mark.slow
def test_a_sigkill_inside_the_final_weights_write_is_cleaned_up_by_the_resume(setup, tmp_path, capsys):
    """A kill inside model.safetensors' write leaves its temporary file in the run folder; the
    training that completes the run removes it, and the other interrupted writes of the files
    training writes there, saying so (a temporary name of anything else is left alone)."""
    cfg, data, reference = setup
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(KILLER), "mid-final-weights", "12", *_args(cfg, data, run_dir)],
                          env=_child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    (killed,) = run_dir.glob(".model.safetensors.*.tmp")
    assert not (run_dir / "model.safetensors").exists()
    (run_dir / ".train.json.x1y2z3w4.tmp").write_text("{")  # as an atomic JSON write leaves it
    (run_dir / ".notes.tmp").write_text("not ours")

    capsys.readouterr()
    assert main(_args(cfg, data, run_dir)) == 0
    err = capsys.readouterr().err
    assert_bitwise_equal(weights(run_dir), weights(reference))
    assert sorted(p.name for p in run_dir.glob(".*.tmp")) == [".notes.tmp"]
    assert (f"{run_dir}: removed 2 incomplete file(s) of interrupted writes: {killed.name}, .train.json.x1y2z3w4.tmp"
            in err), err


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(setup, tmp_path, capsys):
    """The request: "Disk full during a checkpoint write ...: the write fails with a clear message,
    the previous checkpoint stays intact and resumable, and no partial file is mistaken for a
    good one." The checkpoints folder is a real file system with room for one and a half
    checkpoints: step 4's fits, step 8's runs out of space (ENOSPC) part-way."""
    cfg, data, reference = setup
    size = CheckpointStore(reference / "checkpoints").path(12).stat().st_size
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    _mount_tmpfs(ckpts, (size * 3 // 2 + 4095) // 4096 * 4096)
    try:
        capsys.readouterr()
        assert main(_args(cfg, data, run_dir)) == 74  # EX_IOERR
        err = capsys.readouterr().err.strip().splitlines()
        assert re.fullmatch(r"stateloop train: error: \[Errno 28\] .*step_00000008\.ckpt: not written \(No space left on device\); "
                            r"the previous checkpoint step_00000004\.ckpt is intact: free space in .* and rerun the command to resume",
                            err[-1]), err[-3:]
        assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000004.ckpt", "step_00000004.ckpt.sha256"]
        store = CheckpointStore(ckpts)
        assert store.verify(4) is None and store.latest() == store.path(4)
        kept = tmp_path / "kept"
        shutil.copytree(ckpts, kept)
    finally:
        subprocess.run(["umount", str(ckpts)], check=True)
    shutil.copytree(kept, ckpts, dirs_exist_ok=True)  # space freed: the same command resumes
    assert main(_args(cfg, data, run_dir)) == 0
    assert json.loads((run_dir / "train.json").read_text())["resumed_from_step"] == 4
    assert_bitwise_equal(weights(run_dir), weights(reference))


def test_a_disk_full_inside_torchs_writer_is_one_line_exit_74_and_leaves_no_tmp(setup, tmp_path, capsys):
    """The request: "torch's zip writer raises RuntimeError: ... unexpected pos rather than OSError, so
    the documented exit 74 is a traceback and the .tmp stays". Room for half a checkpoint: the first
    one (step 4) runs out of space inside torch's writer; then the final weights' write does."""
    cfg, data, reference = setup
    size = CheckpointStore(reference / "checkpoints").path(12).stat().st_size
    run_dir = tmp_path / "run"
    ckpts = run_dir / "checkpoints"
    _mount_tmpfs(ckpts, (size // 2 + 4095) // 4096 * 4096)
    try:
        capsys.readouterr()
        assert main(_args(cfg, data, run_dir)) == 74
        err = capsys.readouterr().err.strip().splitlines()
        assert re.fullmatch(r"stateloop train: error: \[Errno 28\] .*step_00000004\.ckpt: not written \(No space left on device\); "
                            r"there is no earlier checkpoint: free space in .* and rerun the command to resume", err[-1]), err[-3:]
        assert "Traceback" not in "\n".join(err) and list(ckpts.iterdir()) == []
    finally:
        subprocess.run(["umount", str(ckpts)], check=True)
    # The final weights on a full disk: one OSError naming model.safetensors, no temporary file beside it.
    from stateloop.runs import save_final

    full = tmp_path / "full"
    _mount_tmpfs(full, 64 * 1024)
    try:
        with pytest.raises(OSError, match=r"\[Errno 28\] .*model\.safetensors: not written \(No space left on device\)"):
            save_final(full, weights(reference), {"run": {}})
        assert list(full.iterdir()) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def _wait_for(predicate, proc, timeout=600.0):  # a hang guard: the command starts (imports) first
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("timed out")


@pytest.mark.slow
def test_ctrl_c_checkpoints_like_sigterm(setup, tmp_path):
    """The request: "Ctrl-C should checkpoint like SIGTERM", with one line and no traceback."""
    cfg, data, _ = setup
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "stateloop.cli",
                             *_args(cfg, data, run_dir, "train.max_steps=5000", "train.checkpoint_every=3")],
                            env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    store = CheckpointStore(run_dir / "checkpoints")
    _wait_for(lambda: any(store.verify(s) is None for s in store.steps()), proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == REQUEUE_EXIT, err[-2000:]
    assert "SIGINT: checkpoint" in err and store.verify(store.steps()[0]) is None
    assert not list(store.dir.glob(".*.tmp"))


def test_a_second_ctrl_c_stops_at_once_in_one_line(setup, tmp_path, monkeypatch, capsys):
    """The first Ctrl-C asks for a checkpoint; a second one, before the step ends, stops without
    waiting for it: the command prints one line and exits 130, as a shell reports SIGINT."""
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the test runs in a background job
    stop = signals.StopRequest()
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs between bytecodes of this thread
        assert stop.signal == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
    finally:
        stop.restore()
    assert signal.getsignal(signal.SIGINT) is before  # restored

    def pressed(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "train", pressed)
    capsys.readouterr()
    cfg, data, _ = setup
    assert main(_args(cfg, data, tmp_path / "run")) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["stateloop train: interrupted (Ctrl-C)"]


@pytest.mark.slow
def test_without_a_progress_bar_training_prints_progress_lines(setup, tmp_path, capsys, monkeypatch):
    """The request: "In non-interactive mode, print a periodic progress line (step, tokens, loss,
    tok/s, ETA) to the log." Every log step here (interval 0); with the default interval a
    seconds-long run prints its first and last log step only."""
    cfg, data, _ = setup
    line = re.compile(r"stateloop train: step (\d+)/12 \(\d+%\), ([\d,]+) tokens, loss \d+\.\d{4}, [\d,]+ tok/s, ETA \d+:\d\d:\d\d")
    monkeypatch.setattr(loop, "PROGRESS_EVERY_S", 0.0)
    capsys.readouterr()
    train(resolved(cfg, data, RUN), tmp_path / "a", progress=False)
    steps = [(int(m.group(1)), m.group(2)) for m in map(line.match, capsys.readouterr().err.splitlines()) if m]
    assert steps == [(s, f"{s * 256:,}") for s in (2, 4, 6, 8, 10, 12)]  # log_every 2, 256 tokens a step
    monkeypatch.setattr(loop, "PROGRESS_EVERY_S", 3600.0)
    train(resolved(cfg, data, RUN), tmp_path / "b", progress=False)
    assert [int(m.group(1)) for m in map(line.match, capsys.readouterr().err.splitlines()) if m] == [2, 12]


def test_checkpoints_are_not_staged_in_tmpdir(setup, tmp_path, monkeypatch):
    """The request: "Lightning stages every checkpoint in memory and in $TMPDIR, so a small
    node-local /tmp kills training although the run folder has room." Every temporary file a
    training makes is opened beside its target (mkstemp with dir=...), none in $TMPDIR."""
    import tempfile

    cfg, data, reference = setup
    in_tmpdir = []
    mkstemp = tempfile.mkstemp

    def recording(*a, **k):
        if k.get("dir") is None and (len(a) < 3 or a[2] is None):
            in_tmpdir.append(a)
        return mkstemp(*a, **k)

    monkeypatch.setattr(tempfile, "mkstemp", recording)
    from stateloop.train import checkpoint

    rehashed = []
    monkeypatch.setattr(checkpoint, "sha256_file", lambda p: rehashed.append(p))
    train(resolved(cfg, data, RUN), tmp_path / "run", progress=False)
    assert in_tmpdir == []
    assert rehashed == []  # each checkpoint was hashed while written, not read back
    store = CheckpointStore(tmp_path / "run" / "checkpoints")
    monkeypatch.undo()
    assert [store.verify(s) for s in store.steps()] == [None, None]  # and the sidecars match the files
    assert_bitwise_equal(weights(tmp_path / "run"), weights(reference))
