"""MLflow and a training killed with SIGKILL (nothing in the process can react): the next attempt
closes the dead attempt's run or continues it without logging a step twice; MLflow's own tags."""

from __future__ import annotations

import getpass
import json
import signal
import time
from pathlib import Path

from train_support import cli, resolved

from stateloop.data.shards import ShardSet
from stateloop.runs import code_version
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import train

RUN = "t/stateloop/K2_ds32_seed1234"
FAST = ["train.log_every=1", "train.val_tokens=0"]


def _start(cfg_path, data, run_dir, overrides):
    return cli(["train", "--config", str(cfg_path), RUN, "--data-dir", str(data), "--out", str(run_dir),
                "--no-progress", "train.max_steps=100000", *overrides], cwd=run_dir.parent)


def _kill_when(proc, condition, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"training exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("training did not get there in time")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def _steps(client, run_dir) -> tuple[str | None, list]:
    """(MLflow run id of RUN_DIR/mlflow.json, its train/loss history) once the file exists."""
    path = run_dir / "mlflow.json"
    if not path.is_file():
        return None, []
    run_id = json.loads(path.read_text())["run_id"]
    return run_id, client.get_metric_history(run_id, "train/loss")


def test_sigkill_before_the_first_checkpoint_leaves_no_run_running(tiny_setup, tmp_path, mlflow_uri, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    cfg_path, data = tiny_setup
    client = MlflowClient(mlflow_uri)
    run_dir = tmp_path / "run"
    proc = _start(cfg_path, data, run_dir, ["train.checkpoint_every=0", *FAST])
    _kill_when(proc, lambda: len(_steps(client, run_dir)[1]) >= 3)
    assert not list(run_dir.glob("checkpoints/*.ckpt"))
    dead = _steps(client, run_dir)[0]
    assert client.get_run(dead).info.status == "RUNNING"  # nothing in the killed process could close it

    # The next attempt starts from scratch in a new MLflow run and closes the dead one.
    result = train(resolved(cfg_path, data, overrides=["train.max_steps=6", "train.checkpoint_every=0", *FAST]),
                   run_dir, progress=False)
    new = result.summary["mlflow_run_id"]
    assert new != dead and json.loads((run_dir / "mlflow.json").read_text())["run_id"] == new
    old = client.get_run(dead)
    assert old.info.status == "KILLED" and "stateloop.killed" in old.data.tags
    run = client.get_run(new)
    assert run.info.status == "FINISHED" and [m.step for m in client.get_metric_history(new, "train/loss")] == [1, 2, 3, 4, 5, 6]
    # MLflow's own tags: the UI's User, Source and Git commit columns.
    assert run.info.user_id == run.data.tags["mlflow.user"] == getpass.getuser()
    assert run.data.tags["mlflow.source.name"] == "stateloop train" and run.data.tags["mlflow.source.type"] == "LOCAL"
    assert code_version() != "unknown"  # the tests run in a git checkout
    assert run.data.tags["mlflow.source.git.commit"] == code_version().removesuffix("+dirty")


def test_sigkill_after_a_checkpoint_then_resume_logs_every_step_once(tiny_setup, tmp_path, mlflow_uri):
    from mlflow.tracking import MlflowClient

    cfg_path, data = tiny_setup
    client = MlflowClient(mlflow_uri)
    run_dir = tmp_path / "run"
    store = CheckpointStore(run_dir / "checkpoints")

    def complete():
        return [s for s in store.steps() if store.sidecar(store.path(s)).is_file()]

    def logged_past_a_checkpoint() -> bool:
        done = complete()
        history = _steps(client, run_dir)[1]
        return bool(done and history) and done == complete() and max(m.step for m in history) >= max(done) + 10

    # Every 5th step logged: the background logger keeps up with training (a sqlite commit takes
    # longer than a tiny step), so the kill can land between a checkpoint and the next one.
    # A constant lr: the shorter budget of the resume changes no step's lr, so the resume is exact.
    every = ["train.checkpoint_every=100", "train.log_every=5", "train.val_tokens=0", "train.schedule=constant"]
    proc = _start(cfg_path, data, run_dir, every)
    _kill_when(proc, logged_past_a_checkpoint)
    run_id, history = _steps(client, run_dir)
    before = {m.step: m.value for m in history}
    last = max(before)
    ckpt = next(s for s in store.steps() if store.path(s) == store.latest())
    assert ckpt < last, "the kill came before any step after the checkpoint was logged: the test proves nothing"
    assert client.get_run(run_id).info.status == "RUNNING"

    # The resumed attempt continues the same MLflow run; the steps after the checkpoint that the
    # killed attempt logged are not logged again.
    done = train(resolved(cfg_path, data, overrides=[f"train.max_steps={last + 10}", *every]), run_dir, progress=False)
    assert done.summary["resumed_from_step"] == ckpt and done.summary["mlflow_run_id"] == run_id
    after = client.get_metric_history(run_id, "train/loss")
    steps = [m.step for m in after]
    assert len(steps) == len(set(steps)), sorted(s for s in set(steps) if steps.count(s) > 1)
    assert set(steps) >= set(range(ckpt + 5, last + 11, 5))
    assert {m.step: m.value for m in after if m.step in before} == before  # kept (a gap the killed logger left is filled)
    assert client.get_run(run_id).info.status == "FINISHED"

    # The data it read is the run's dataset input (the UI's Datasets column), once across both attempts.
    inputs = [(d.dataset, {t.key: t.value for t in d.tags}["mlflow.data.context"])
              for d in client.get_run(run_id).inputs.dataset_inputs]
    assert [context for _, context in inputs] == ["training"]  # val_tokens = 0: no validation windows read
    train_set = next(ds for ds, context in inputs if context == "training")
    shards = ShardSet(data, "train")
    assert train_set.name == "t/train" and train_set.digest == shards.fingerprint()
    assert json.loads(train_set.profile)["tokens"] == len(shards)
    # MLflow keeps one dataset per (name, digest) in an experiment: the source is the first run's
    # that logged those tokens (this module's store is shared), a meta.json with the same shards
    source = Path(json.loads(train_set.source)["uri"])
    assert source.name == "meta.json" and ShardSet(source.parent, "train").fingerprint() == shards.fingerprint()
