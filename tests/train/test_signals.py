"""The command as a scheduler sees it, in subprocesses: SIGKILL mid-way then a restart reaches
the same final weights bit for bit; SIGTERM leaves a complete checkpoint and exit status 75."""

from __future__ import annotations

import json
import signal
import time

import pytest

from stateloop.cli import main
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import REQUEUE_EXIT, train
from support.training import SUBPROCESS_WAIT_S, assert_bitwise_equal, cli, resolved, weights


def _wait_for_checkpoint(proc, store: CheckpointStore, min_step: int, timeout: float = SUBPROCESS_WAIT_S) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [s for s in store.steps() if s >= min_step and store.sidecar(store.path(s)).is_file()]
        if done:
            return done[0]
        if proc.poll() is not None:
            raise AssertionError(f"training exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("no checkpoint appeared in time")


@pytest.mark.slow
def test_sigkill_then_restart_is_bitwise_equal_to_an_uninterrupted_run(tiny_setup, tmp_path, capsys):
    cfg_path, data = tiny_setup
    overrides = ["train.max_steps=40", "train.checkpoint_every=4", "train.val_every=10"]
    # Uninterrupted reference, in this process.
    reference = train(resolved(cfg_path, data, overrides=overrides), tmp_path / "ref", progress=False)
    assert reference.status == "finished"

    run_dir = tmp_path / "killed"
    args = ["train", "--config", str(cfg_path), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
            "--out", str(run_dir), "--no-progress", "--set", *overrides]
    proc = cli(args, cwd=tmp_path)
    store = CheckpointStore(run_dir / "checkpoints")
    step = _wait_for_checkpoint(proc, store, min_step=4)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (run_dir / "model.safetensors").exists(), "the run finished before the kill: the test proves nothing"
    assert step < 40

    # Restart the same command (in this process: a second interpreter start costs seconds): it
    # resumes from the newest complete checkpoint by itself.
    capsys.readouterr()
    assert main(args) == 0
    err = capsys.readouterr().err
    resumed = json.loads((run_dir / "train.json").read_text())["resumed_from_step"]
    assert resumed is not None and resumed >= step and "resuming from" in err
    assert_bitwise_equal(weights(run_dir), weights(tmp_path / "ref"))


@pytest.mark.slow
def test_sigterm_leaves_a_complete_checkpoint_and_requeue_status(tiny_setup, tmp_path):
    """Two DDP processes on CPU (gloo): the signal reaches the launching process (rank 0) only, the
    per-step all-reduce tells rank 1, both save one checkpoint together and exit with 75. The
    checkpoint then resumes on one device (the global batch does not depend on the device count)."""
    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    proc = cli(["train", "--config", str(cfg_path), "t/vanilla_looped/K2_ds0_seed1234", "--data-dir", str(data),
                "--out", str(run_dir), "--no-progress", "--set", "train.devices=2", "train.strategy=ddp",
                "train.max_steps=5000", "train.checkpoint_every=5"], cwd=tmp_path)
    store = CheckpointStore(run_dir / "checkpoints")
    _wait_for_checkpoint(proc, store, min_step=5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == REQUEUE_EXIT == 75, err[-2000:]
    step = store.steps()[0]
    assert store.verify(step) is None and store.latest() == store.path(step)
    assert "SIGTERM: checkpoint" in err and f"exiting with status {REQUEUE_EXIT}" in err
    assert not (run_dir / "model.safetensors").exists() and not list(store.dir.glob(".*.tmp"))

    cfg = resolved(cfg_path, data, "t/vanilla_looped/K2_ds0_seed1234", [f"train.max_steps={step + 2}", "train.val_tokens=0"])
    done = train(cfg, run_dir, progress=False)
    assert done.status == "finished" and done.summary["resumed_from_step"] == step and done.summary["world_size"] == 1
