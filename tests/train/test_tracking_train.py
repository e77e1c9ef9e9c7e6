"""MLflow and a training killed with SIGKILL (nothing in the process can react): the next attempt
closes the dead attempt's run or continues it without logging a step twice; MLflow's own tags."""

from __future__ import annotations

import getpass
import json
import signal
import time
from pathlib import Path

import pytest

from stateloop.data.shards import ShardSet
from stateloop.files import code_version
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import train
from support.training import SUBPROCESS_WAIT_S, cli, resolved

RUN = "t/stateloop/K2_ds32_seed1234"
FAST = ["train.log_every=1", "train.val_tokens=0"]


def _start(cfg_path, data, run_dir, overrides):
    return cli(["train", "--config", str(cfg_path), RUN, "--data-dir", str(data), "--out", str(run_dir),
                "--no-progress", "--set", "train.max_steps=100000", *overrides], cwd=run_dir.parent)


def _kill_when(proc, condition, timeout: float = SUBPROCESS_WAIT_S) -> None:
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _with_tokenizer(data: Path) -> Path:
    """The test shards' 64 ids as a word-level tokenizer (id 0 the end-of-document token), so the
    run can be exported: what an MLflow model of the run holds."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from stateloop.data.shards import read_meta, write_meta

    vocab = {"<eos>": 0, **{f"w{i}": i for i in range(1, 64)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<eos>"])
    tok.save(str(data / "tokenizer.json"))
    write_meta(data, {**read_meta(data), "tokenizer": {"file": "tokenizer.json"}})
    return data


@pytest.mark.slow
def test_a_finished_run_is_an_mlflow_model_with_its_system_metrics(tiny_setup, tmp_path, mlflow_uri):
    """The request: "Each trained run logs its final weights as an MLflow model (a LoggedModel, with
    the export's directory ...) so the Models tab lists it; optionally register models by name with
    a config switch" and "System metrics (MLflow's own monitor) for training runs, on by default".
    The model's artifacts, downloaded through models:/<id>, load in transformers and give the run's
    logits; the registry holds one version of it; a second finish logs nothing twice."""
    import mlflow
    import torch
    from mlflow.tracking import MlflowClient
    from transformers import AutoModelForCausalLM

    from stateloop.runs import load_model
    from stateloop.tracking.registry import log_model

    cfg_path, data = tiny_setup
    _with_tokenizer(data)
    client = MlflowClient(mlflow_uri)
    run_dir = tmp_path / "run"
    over = ["train.max_steps=30", "train.val_tokens=0", "train.mlflow_system_metrics_s=0.2",
            "train.mlflow_register_model='{scale}-{model}-K{K}'"]
    result = train(resolved(cfg_path, data, overrides=over), run_dir, progress=False)
    run_id, model_id = result.summary["mlflow_run_id"], result.summary["mlflow_model_id"]
    exp = client.get_run(run_id).info.experiment_id
    models = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    assert [m.model_id for m in models] == [model_id]
    model = models[0]
    assert str(model.status) == "READY" and model.name == "t-stateloop-K2_ds32_seed1234"
    assert model.tags["stateloop.run"] == RUN and model.params["K"] == "2" and model.params["model"] == "stateloop"
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [model_id]

    mlflow.set_tracking_uri(mlflow_uri)
    folder = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{model_id}", dst_path=str(tmp_path / "dl")))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ours, _ = load_model(run_dir)
    ids = torch.tensor([[0, 5, 9, 13, 17, 21, 0, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours.eval()(ids).logits, rtol=1e-5, atol=1e-5)

    versions = client.search_model_versions("name = 't-stateloop-K2'")
    assert [(v.source, v.run_id) for v in versions] == [(f"models:/{model_id}", run_id)]
    again = log_model(client, run_id, run_dir, RUN, {}, {}, 30, register="t-stateloop-K2")
    assert again == model_id and len(client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")) == 1
    assert len(client.search_model_versions("name = 't-stateloop-K2'")) == 1

    cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    assert cpu and all(0 <= m.value <= 100 * 64 for m in cpu) and [m.step for m in cpu] == list(range(len(cpu)))


@pytest.mark.slow
def test_system_metrics_and_the_model_are_off_by_their_keys(tiny_setup, tmp_path, mlflow_uri):
    """On by default ("System metrics ... for training runs, on by default, off by a config key")."""
    from mlflow.tracking import MlflowClient

    from stateloop.config.train import TrainConfig

    assert TrainConfig().mlflow_system_metrics_s > 0 and TrainConfig().mlflow_log_model

    cfg_path, data = tiny_setup
    _with_tokenizer(data)
    client = MlflowClient(mlflow_uri)
    over = ["train.max_steps=30", "train.val_tokens=0", "train.mlflow_system_metrics_s=0", "train.mlflow_log_model=false"]
    result = train(resolved(cfg_path, data, overrides=over), tmp_path / "run", progress=False)
    run = client.get_run(result.summary["mlflow_run_id"])
    assert not [k for k in run.data.metrics if k.startswith("system/")]
    assert "mlflow_model_id" not in result.summary and not run.outputs.model_outputs
    assert not client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")


def test_a_register_name_mlflow_refuses_is_one_line_naming_the_key(tiny_setup):
    import pytest

    from stateloop.config import ConfigError

    cfg_path, data = tiny_setup
    for bad, says in (("{scale}/{model}", "has no '/' or ':'"), ("{width}", "is not a name with the fields"),
                       ("{model.__class__}", "is not a name with the fields"), ("{scale[0]}", "is not a name with the fields")):
        with pytest.raises(ConfigError, match="train.mlflow_register_model") as err:
            resolved(cfg_path, data, overrides=[f"train.mlflow_register_model='{bad}'"])
        assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_tracking_off_trains_without_importing_mlflow_or_touching_a_store(tiny_setup, tmp_path):
    """train.mlflow_tracking: false is the one key that takes MLflow out of a training job: no
    import (about 3 CPU-s of a job's fixed cost, benchmarks/bench_startup.py), no store, no run;
    the run folder is complete without it."""
    import os
    import subprocess
    import sys

    from support.training import ROOT

    cfg_path, data = tiny_setup
    store = tmp_path / "never" / "mlflow.db"
    probe = ("import sys, runpy; sys.argv = ['stateloop'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('stateloop.cli', run_name='__main__')\n"
             "except SystemExit as e:\n    assert not e.code, e.code\n"
             "print('mlflow imported:', any(m == 'mlflow' or m.startswith('mlflow.') for m in sys.modules))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    done = subprocess.run([sys.executable, "-c", probe, "train", "--config", str(cfg_path), "t/stateloop/K2_ds32_seed1234",
                           "--data-dir", str(data), "--out", str(tmp_path / "run"), "--no-progress", "--set", "train.max_steps=4",
                           "train.mlflow_tracking=false"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mlflow imported: False" in done.stdout
    assert not store.parent.exists()
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["steps"] == 4 and summary["mlflow_run_id"] is None and "mlflow_model_id" not in summary
    assert not (tmp_path / "run" / "mlflow.json").exists()
