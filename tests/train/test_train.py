"""Training in-process at a tiny config: learning, MLflow entries, corrupt-checkpoint fallback
with an exact resume, the non-finite guard, and SIGUSR1 at a step boundary."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from stateloop.runs import load_model, saved_config
from stateloop.train.checkpoint import CheckpointStore
from stateloop.train.loop import NonFiniteLoss, train
from support.training import assert_bitwise_equal, resolved, weights


def _mlflow_run(run_dir):
    from mlflow.tracking import MlflowClient

    info = json.loads((run_dir / "mlflow.json").read_text())
    client = MlflowClient(info["tracking_uri"])
    return client, client.get_run(info["run_id"])


@pytest.mark.slow
def test_loss_falls_and_mlflow_reads_back(tiny_setup, tmp_path):
    cfg_path, data = tiny_setup
    cfg = resolved(cfg_path, data, overrides=["train.max_steps=60", "train.val_every=20", "train.checkpoint_every=0",
                                              "train.log_every=5", "train.warmup_steps=5", "train.peak_tflops=0.001"])
    run_dir = tmp_path / "run"
    result = train(cfg, run_dir, progress=False)
    assert result.status == "finished" and result.step == 60

    client, run = _mlflow_run(run_dir)
    history = [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")]
    val = client.get_metric_history(run.info.run_id, "val/loss")
    # Loss falls on the learnable stream: from about ln(96) = 4.56 at the start ...
    assert history[0] > 3.8
    # ... to well below the 4.16 nats of guessing uniformly among the tokenizer's 64 ids (generous margin).
    assert result.summary["final_train_loss"] < history[0] - 1.0
    assert result.summary["final_val_loss"] < math.log(64) - 1.0
    # MLflow: run name = run id, flattened resolved config as params, metrics at the logged steps.
    assert run.info.run_name == "t/stateloop/K2_ds32_seed1234" and run.info.status == "FINISHED"
    assert run.data.params["model.d_model"] == "32" and run.data.params["train.max_steps"] == "60"
    assert run.data.params["run.id"] == "t/stateloop/K2_ds32_seed1234" and run.data.params["data.dir"] == str(data.resolve())
    assert run.data.tags["model"] == "stateloop" and run.data.tags["K"] == "2"
    # the splits it read are its dataset inputs, by MLflow context (tests/train/test_tracking_train.py: once each)
    assert sorted((d.dataset.name, d.tags[0].value) for d in run.inputs.dataset_inputs) == [
        ("t/train", "training"), ("t/val", "validation")]
    assert len(history) == 12 and [m.step for m in val] == [20, 40, 60]
    lrs = client.get_metric_history(run.info.run_id, "train/lr")
    assert lrs[0].step == 5 and lrs[0].value == pytest.approx(3e-3)  # step 5 uses eta(4) = peak after 5 warmup steps
    assert set(run.data.metrics) >= {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/tokens",
                                     "val/loss", "val/ppl"}
    # MFU = FLOPs per sequence x sequences/s / peak (a peak is configured here; CPUs have none by default).
    from stateloop.config.model import ModelConfig
    from stateloop.train.flops import flops_per_sequence

    fl = flops_per_sequence(ModelConfig(**cfg["model"]), 32)
    mfu = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/mfu")}
    tok_s = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/tokens_per_s")}
    assert mfu.keys() == tok_s.keys() and len(mfu) == 12
    for step in mfu:
        assert mfu[step] == pytest.approx(fl * tok_s[step] / 32 / 1e9)

    summary = json.loads((run_dir / "train.json").read_text())
    assert summary["mlflow_run_id"] == run.info.run_id and summary["tokens"] == 60 * 8 * 32
    # The validation curve in train.json: the points MLflow holds, the last one the final loss.
    curve = summary["val_curve"]
    assert [(p["step"], p["tokens"]) for p in curve] == [(s, s * 8 * 32) for s in (20, 40, 60)]
    assert [p["loss"] for p in curve] == pytest.approx([m.value for m in val], rel=1e-6)
    assert curve[-1]["loss"] == summary["final_val_loss"]
    # StateLoop's validations carry its state's diagnostics (K = 2: states S^1, S^2), also in MLflow per state.
    state = curve[-1]["state"]
    assert state["states"] == [1, 2] and state["tokens"] == 16 * 32 and 0 < state["write_rate_mean"][0] < 1
    ratio = client.get_metric_history(run.info.run_id, "val/state/read_ratio_2")
    assert [m.step for m in ratio] == [20, 40, 60] and ratio[-1].value == pytest.approx(state["terminal_read_ratio"])
    # The folder alone rebuilds the model, and its validation loss is the one reported.
    model, saved = load_model(run_dir)
    assert saved == cfg
    from stateloop.data.shards import ShardSet
    from stateloop.evaluate.perplexity import heldout_windows, mean_nll

    windows = heldout_windows(ShardSet(data, "val"), 32, max_windows=512 // 32)
    assert mean_nll(model, windows, batch_size=4) == pytest.approx(summary["final_val_loss"], rel=1e-5)
    states = model(windows[:, :-1], return_states=True).states  # the state norms, recomputed from the final weights
    assert state["state_norm"] == pytest.approx([S.norm(dim=-1).mean().item() for S in states], rel=1e-5)
    # The windows are named by the sha256 of their tokens (recomputed here from the split's start).
    import hashlib

    assert summary["val_windows"] == {"split": "val", "windows": 16, "seq_len": 32,
                                      "sha256": hashlib.sha256(windows.long().numpy().tobytes()).hexdigest()}


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_and_resume_is_exact(tiny_setup, tmp_path, capsys):
    cfg_path, data = tiny_setup
    cfg = resolved(cfg_path, data)  # 12 steps, checkpoints at 4, 8, 12 (keeps 2)
    run_dir = tmp_path / "run"
    train(cfg, run_dir, progress=False)
    reference = weights(run_dir)
    reference_curve = json.loads((run_dir / "train.json").read_text())["val_curve"]
    assert [p["step"] for p in reference_curve] == [6, 12]
    store = CheckpointStore(run_dir / "checkpoints")
    assert store.steps() == [12, 8] and store.verify(12) is None and store.verify(8) is None
    first_run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]

    # Truncate the newest checkpoint (a crash in the middle of a copy, a full disk, ...).
    ckpt = store.path(12)
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    (run_dir / "model.safetensors").unlink()
    capsys.readouterr()
    result = train(cfg, run_dir, progress=False)
    err = capsys.readouterr().err
    assert "step_00000012.ckpt: truncated or corrupt" in err
    assert "using the previous checkpoint step_00000008.ckpt" in err
    assert "changed since" not in err  # same tokens: no batch-stream warning
    assert result.summary["resumed_from_step"] == 8
    assert_bitwise_equal(weights(run_dir), reference)  # steps 9-12 redone exactly
    # The curve: step 6's point from the checkpoint of step 8, step 12's validated again, equal.
    assert result.summary["val_curve"] == reference_curve
    assert store.verify(12) is None  # rewritten whole
    # The resumed run continued the same MLflow run.
    client, run = _mlflow_run(run_dir)
    assert run.info.run_id == first_run_id and run.info.status == "FINISHED"

    # Corrupt bytes of the same size are caught by the checksum too.
    blob = bytearray(ckpt.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    ckpt.write_bytes(bytes(blob))
    assert "sha256 does not match" in store.verify(12)
    assert store.latest() == store.path(8)


@pytest.mark.slow
def test_resume_after_the_training_tokens_changed_warns(tiny_setup, tmp_path, capsys):
    """The checkpoint records which train tokens the batch stream came from; resuming on a
    re-tokenized data folder says so (the run continues: re-tokenizing can be deliberate)."""
    from stateloop.data.shards import ShardSet
    from support.training import write_shards

    cfg_path, data = tiny_setup
    cfg = resolved(cfg_path, data)
    run_dir = tmp_path / "run"
    train(cfg, run_dir, progress=False)
    store = CheckpointStore(run_dir / "checkpoints")
    before = ShardSet(data, "train").fingerprint()
    assert torch.load(store.path(12), weights_only=True)["data"]["fingerprint"] == before
    write_shards(data, seed=5)  # same folder, same sizes, other tokens
    after = ShardSet(data, "train").fingerprint()
    assert after != before
    store.path(12).unlink()
    (run_dir / "model.safetensors").unlink()
    capsys.readouterr()
    result = train(cfg, run_dir, progress=False)
    err = capsys.readouterr().err
    assert result.summary["resumed_from_step"] == 8
    assert "changed since step_00000008.ckpt" in err and f"{before} -> {after}" in err, err
    assert torch.load(store.path(12), weights_only=True)["data"]["fingerprint"] == after


def test_nonfinite_loss_stops_naming_the_step(tiny_setup, tmp_path, monkeypatch):
    import stateloop.train.loss as loss_module  # the training step's loss (train/loss.py)

    cfg_path, data = tiny_setup
    cfg = resolved(cfg_path, data, overrides=["train.checkpoint_every=2", "train.val_tokens=0"])
    calls = {"n": 0}
    real = torch.nn.functional.cross_entropy

    def poisoned(logits, target):  # micro-batches 1..10 fine (steps 1-5), step 6 turns NaN
        calls["n"] += 1
        loss = real(logits, target)
        return loss * float("nan") if calls["n"] > 10 else loss

    monkeypatch.setattr(loss_module.F, "cross_entropy", poisoned)
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteLoss,
                       match=r"^step 6: non-finite loss or gradient norm .*the last good checkpoint is .*step_00000004\.ckpt"):
        train(cfg, run_dir, progress=False)
    store = CheckpointStore(run_dir / "checkpoints")
    assert store.steps() == [4, 2] and store.verify(4) is None
    assert not (run_dir / "model.safetensors").exists()
    _, run = _mlflow_run(run_dir)
    assert run.info.status == "FAILED"


@pytest.mark.slow
def test_sigusr1_checkpoints_at_the_step_boundary_then_resumes(tiny_setup, tmp_path, capsys):
    cfg_path, data = tiny_setup
    cfg = resolved(cfg_path, data, overrides=["train.max_steps=400", "train.checkpoint_every=3", "train.val_tokens=0"])
    run_dir = tmp_path / "run"
    store = CheckpointStore(run_dir / "checkpoints")

    finished = threading.Event()

    def send_when_training():
        # The signal only once the loop is checkpointing (its handler is installed), however slow
        # the machine; never after train() returned (SIGUSR1 would end pytest itself). If no
        # checkpoint ever comes, the run goes on to step 400 and the assertions below fail.
        while not finished.is_set() and not store.steps():
            time.sleep(0.01)
        if not finished.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)

    watcher = threading.Thread(target=send_when_training, daemon=True)
    watcher.start()
    try:
        result = train(cfg, run_dir, progress=False)
    finally:
        finished.set()
        watcher.join()
    assert result.status == "interrupted" and 3 <= result.step < 400
    assert store.steps()[0] == result.step and store.verify(result.step) is None
    assert "SIGUSR1: checkpoint" in capsys.readouterr().err and not (run_dir / "model.safetensors").exists()
    _, run = _mlflow_run(run_dir)
    assert run.info.status == "KILLED"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handlers restored

    # Rerunning resumes from that step (shorter budget here to keep the test fast).
    done = train({**cfg, "train": {**cfg["train"], "max_steps": result.step + 2}}, run_dir, progress=False)
    assert done.summary["resumed_from_step"] == result.step and done.status == "finished"


@pytest.mark.slow
def test_loss_falls_on_the_synthetic_corpus_at_the_tiny_config(synthetic_shards, tmp_path, mlflow_uri, monkeypatch):
    """configs/tiny.yaml's model (stateloop, K=4, d_s=64) for a short budget: from ln(2048) = 7.6
    nats at initialisation to well below guessing among the 512 BPE ids (6.2 nats)."""
    from pathlib import Path

    from mlflow.tracking import MlflowClient

    from stateloop.resolve import resolve_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    tiny = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
    cfg = resolve_run(tiny, "tiny/stateloop/K4_ds64_seed1234",
                      ["train.max_steps=30", "train.seq_len=64", "train.micro_batch=16", "train.global_batch=16",
                       "train.warmup_steps=5", "train.val_every=0", "train.val_tokens=4096", "train.checkpoint_every=0",
                       "train.log_every=5"], synthetic_shards)
    result = train(cfg, tmp_path / "run", progress=False)
    client = MlflowClient(mlflow_uri)
    first = client.get_metric_history(result.summary["mlflow_run_id"], "train/loss")[0].value
    assert first > 6.5  # near ln(2048) at the start
    assert result.summary["final_val_loss"] < math.log(512) - 1.0
    assert result.summary["final_val_loss"] < first - 2.0


@pytest.mark.parametrize("model", ["stateloop", "stateloop_mamba2", "state_only"])
@pytest.mark.slow
def test_bf16_mixed_training_runs_on_the_cpu(tiny_setup, tmp_path, model):
    """``train.precision: bf16-mixed`` (configs/paper.yaml, configs/gpu.yaml) through Fabric's CPU
    bf16 autocast, the nearest run of the GPU setting here: StateLoop trains (it crashed in its
    state update before the float32 state contract), records the precision it used, and its loss
    falls; the weights stay float32 master weights."""
    import yaml

    from stateloop.resolve import resolve_run

    cfg_path, data = tiny_setup
    raw = yaml.safe_load(cfg_path.read_text())
    raw["experiments"]["e"]["models"] = ["vanilla_looped", "stateloop", "stateloop_mamba2", "state_only"]
    cfg_path.write_text(yaml.safe_dump(raw))
    overrides = ["train.precision=bf16-mixed", "train.max_steps=30", "train.val_every=30", "train.checkpoint_every=0"]
    if model == "stateloop_mamba2":
        overrides += ["model.mamba_head_dim=16", "model.mamba_n_groups=2", "model.mamba_d_state=8", "model.mamba_chunk_size=8"]
    cfg = resolve_run(cfg_path, f"t/{model}/K2_ds32_seed1234", overrides, data)
    run_dir = tmp_path / "run"
    result = train(cfg, run_dir, progress=False)
    summary = json.loads((run_dir / "train.json").read_text())
    assert result.status == "finished" and summary["precision"] == "bf16-mixed"
    assert math.isfinite(summary["final_val_loss"]) and summary["final_val_loss"] < math.log(96) - 0.5
    assert all(v.dtype == torch.float32 for v in weights(run_dir).values())
    # the validation's state diagnostics are recorded under autocast too (Fabric's input conversion
    # copied the hook's dict, which stayed empty)
    assert summary["val_curve"][-1]["state"]["states"] == ([1] if model == "state_only" else [1, 2])  # X^1 / S^1, S^2


def test_a_folder_holds_one_run_and_a_resume_keeps_its_optimizer_settings(tiny_setup, tmp_path, capsys):
    """Training another run into a finished run's folder, or resuming with another lr, is refused
    in one line (exit 2) before anything is written: the folder's config.yaml and weights stay
    the finished run's, and eval of it still works."""
    from stateloop.cli import main

    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    train(resolved(cfg_path, data, overrides=["train.max_steps=4"]), run_dir, progress=False)
    before = {p: p.read_bytes() for p in (run_dir / "config.yaml", run_dir / "model.safetensors")}
    capsys.readouterr()
    cases = [
        (["t/stateloop/K3_ds32_seed1234"], r"holds run t/stateloop/K2_ds32_seed1234, not t/stateloop/K3_ds32_seed1234"),
        (["t/stateloop/K2_ds32_seed1234", "--set", "model.norm_eps=1e-6"], r"model.norm_eps = 1e-06 differs from the run's 1e-05"),
        (["t/stateloop/K2_ds32_seed1234", "--set", "train.max_steps=4", "train.lr=1e-3"],
         r"train.lr: 0.001 differs from 0.003 in .*config.yaml, and a resumed optimizer and schedule would keep 0.003"),
    ]
    for args, pattern in cases:
        rc = main(["train", "--config", str(cfg_path), "--data-dir", str(data), "--out", str(run_dir), *args])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        import re

        assert re.search(pattern, err), err
        assert all(p.read_bytes() == blob for p, blob in before.items())


def test_a_second_training_of_the_same_folder_is_refused(tiny_setup, tmp_path, capsys):
    """Two `stateloop train` on one run folder at once: the second refuses in one line naming the
    holder (pid and host of the lock's owner) and writes nothing; once the lock is free it trains."""
    import socket

    from stateloop.cli import main
    from stateloop.train.run_folder import run_lock

    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    args = ["train", "--config", str(cfg_path), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
            "--out", str(run_dir), "--set", "train.max_steps=2", "--no-progress"]
    with run_lock(run_dir):  # held as a training in another process would hold it (a separate flock)
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"(pid {os.getpid()} on {socket.gethostname()})" in err, err
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    assert main(args) == 0 and (run_dir / "model.safetensors").is_file()
    assert (run_dir / ".lock").read_text() == ""  # released


def _train_cli(cfg_path, data, run_dir, *args):
    from stateloop.cli import main

    return main(["train", "--config", str(cfg_path), "t/stateloop/K2_ds32_seed1234", "--data-dir", str(data),
                 "--out", str(run_dir), "--no-progress", "--set", "train.max_steps=8", *args])


@pytest.mark.slow
def test_training_never_saves_or_reads_the_eval_section(tiny_setup, tmp_path):
    """The request: the run config's eval section is resolved when the run is evaluated; a run trained
    from a RunConfig carrying one writes the config.yaml and weights of one without."""
    import dataclasses

    from stateloop.config.evaluate import EvalConfig
    from stateloop.resolve import resolve_run

    cfg_path, data = tiny_setup
    rc = resolve_run(cfg_path, "t/stateloop/K2_ds32_seed1234", ["train.max_steps=2"], data)
    train(rc, tmp_path / "plain", progress=False)
    train(dataclasses.replace(rc, eval=EvalConfig(tasks=["synth_mc"], task_dir=str(tmp_path))), tmp_path / "eval", progress=False)
    plain, evaluated = ((tmp_path / name / "config.yaml").read_text() for name in ("plain", "eval"))
    assert evaluated == plain and "eval" not in yaml.safe_load(plain)
    assert saved_config(tmp_path / "eval") == saved_config(tmp_path / "plain") == rc.as_dict()
    assert_bitwise_equal(weights(tmp_path / "eval"), weights(tmp_path / "plain"))


@pytest.mark.slow
def test_a_changed_setting_never_deletes_weights_and_then_refuses(tiny_setup, tmp_path, capsys):
    """The request: "Changing train.lr and rerunning the DAG: Snakemake plans the retrain, deletes the
    finished run's model.pt and train.json, and then stateloop train refuses". The DAG's train rule
    passes --restart-on-change: the rerun starts the run afresh, saying so, and records the lr it
    trained with; by hand, without the flag, the change is refused and nothing is removed."""
    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    assert _train_cli(cfg_path, data, run_dir) == 0
    for name in ("model.safetensors", "train.json"):  # what Snakemake removes before the rerun
        (run_dir / name).unlink()
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    capsys.readouterr()
    assert _train_cli(cfg_path, data, run_dir, "train.lr=1e-3") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.lr: 0.001 differs from 0.003" in err and "--restart-on-change" in err, err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ckpts

    assert _train_cli(cfg_path, data, run_dir, "train.lr=1e-3", "--restart-on-change") == 0
    err = capsys.readouterr().err
    assert "train.lr: 0.001 differs from 0.003" in err and "starting the run afresh (--restart-on-change)" in err, err
    assert json.loads((run_dir / "train.json").read_text())["resumed_from_step"] is None
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"] == 1e-3
    assert saved_config(run_dir)["train"]["lr"] == 1e-3
    rule = (Path(__file__).resolve().parents[2] / "workflow" / "rules" / "train.smk").read_text()
    assert "stateloop train" in rule and "--restart-on-change" in rule  # the DAG's side of the same behaviour


def test_a_folder_copied_without_its_config_resumes_only_its_own_optimizer(tiny_setup, tmp_path, capsys):
    """The request: "A run folder copied without its config.yaml: resuming with train.lr=1e-3 trains
    with the checkpoint's lr but records 1e-3". The checkpoint's own config decides: refused in one
    line naming it, and nothing is recorded."""
    import shutil

    cfg_path, data = tiny_setup
    run_dir, copy = tmp_path / "run", tmp_path / "copy"
    assert _train_cli(cfg_path, data, run_dir, "train.max_steps=12") == 0
    shutil.copytree(run_dir / "checkpoints", copy / "checkpoints")
    capsys.readouterr()
    assert _train_cli(cfg_path, data, copy, "train.max_steps=12", "train.lr=1e-3") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"train.lr: 0.001 differs from 0.003 in {copy / 'checkpoints' / 'step_00000012.ckpt'}" in err, err
    assert sorted(p.name for p in copy.iterdir()) == [".lock", "checkpoints"]  # no config.yaml, weights, mlflow.json


@pytest.mark.slow
def test_an_inexact_resume_says_so_records_it_and_mlflow_keeps_the_new_values(tiny_setup, tmp_path, capsys, mlflow_uri):
    """The request: "train.max_tokens and train.grad_clip changed on resume are applied silently ...
    After an inexact resume, MLflow keeps the redone steps' new values, not the old ones." A resume
    from step 4 of a run that had logged steps 1-8, with another grad_clip and a longer budget: one
    warning each, train.json and an MLflow tag record them, and MLflow's value at step 8 is the
    resumed attempt's."""
    from mlflow.tracking import MlflowClient

    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    assert _train_cli(cfg_path, data, run_dir, "train.log_every=1", "train.val_tokens=0") == 0
    first = json.loads((run_dir / "train.json").read_text())
    for name in ("checkpoints/step_00000008.ckpt", "checkpoints/step_00000008.ckpt.sha256", "model.safetensors", "train.json"):
        (run_dir / name).unlink()  # as if killed after logging step 8, before its checkpoint
    capsys.readouterr()
    assert _train_cli(cfg_path, data, run_dir, "train.log_every=1", "train.val_tokens=0", "train.grad_clip=0.05",
                      "train.max_steps=10") == 0
    err = capsys.readouterr().err
    assert "train.grad_clip changed since step_00000004.ckpt (1.0 -> 0.05): the steps from 4 on clip at the new value" in err, err
    assert ("the budget changed since step_00000004.ckpt (8 -> 10 steps; train.max_tokens, train.max_steps): "
            "the lr schedule is spliced at step 4") in err, err
    second = json.loads((run_dir / "train.json").read_text())
    assert second["resumed_from_step"] == 4 and len(second["inexact_resume"]) == 2
    assert second["mlflow_run_id"] == first["mlflow_run_id"]
    client = MlflowClient(mlflow_uri)
    run = client.get_run(second["mlflow_run_id"])
    assert run.data.tags["stateloop.inexact_resume"].startswith("from step 4: train.grad_clip changed")
    at8 = sorted((m for m in client.get_metric_history(run.info.run_id, "train/loss") if m.step == 8), key=lambda m: m.timestamp)
    assert len(at8) == 2 and at8[0].value != at8[1].value, at8
    assert at8[0].value == pytest.approx(first["final_train_loss"])  # the killed attempt's ...
    assert client.get_run(run.info.run_id).data.params["train.grad_clip"] == "1.0"
    assert run.data.tags["changed_on_resume.train.grad_clip"] == "0.05"  # ... and the truthful record of the change


@pytest.mark.slow
def test_a_resume_with_another_micro_batch_says_so_and_records_it_as_the_other_settings(tiny_setup, tmp_path, capsys,
                                                                                        mlflow_uri):
    """train.micro_batch changed on a resume was applied without a word, while the other changed
    settings are warned about: the resumed steps accumulate the same global batch in other
    micro-batches, not bitwise as an uninterrupted run would. The same path as train.grad_clip's:
    one warning, train.json's inexact_resume, the MLflow tag stateloop.inexact_resume, the param
    kept (MLflow params cannot change) and the new value a changed_on_resume tag."""
    from mlflow.tracking import MlflowClient

    cfg_path, data = tiny_setup
    run_dir = tmp_path / "run"
    assert _train_cli(cfg_path, data, run_dir, "train.val_tokens=0") == 0
    for name in ("checkpoints/step_00000008.ckpt", "checkpoints/step_00000008.ckpt.sha256", "model.safetensors", "train.json"):
        (run_dir / name).unlink()
    capsys.readouterr()
    assert _train_cli(cfg_path, data, run_dir, "train.val_tokens=0", "train.micro_batch=2") == 0
    err = capsys.readouterr().err
    change = "train.micro_batch changed since step_00000004.ckpt (4 -> 2): the steps from 4 on compute the same batches another way"
    assert change in err, err
    summary = json.loads((run_dir / "train.json").read_text())
    assert summary["resumed_from_step"] == 4 and summary["accumulation"] == 4
    assert [c for c in summary["inexact_resume"] if c.startswith(change)], summary["inexact_resume"]
    run = MlflowClient(mlflow_uri).get_run(summary["mlflow_run_id"])
    assert run.data.tags["stateloop.inexact_resume"].startswith(f"from step 4: {change}")
    assert run.data.params["train.micro_batch"] == "4" and run.data.tags["changed_on_resume.train.micro_batch"] == "2"


@pytest.mark.parametrize("key, value", [("micro_batch", 2), ("devices", 2), ("num_nodes", 2), ("precision", "bf16-mixed"),
                                        ("compile", True)])
def test_every_setting_of_how_the_steps_compute_is_a_change_a_resume_records(tiny_setup, capsys, key, value):
    """The settings that change how the same batches are computed (the accumulation's grouping,
    the processes that reduce the gradient, the arithmetic) are each a change a resume warns about
    and returns for the record."""
    from stateloop.train.run_folder import check_resume
    from stateloop.train.sampler import STREAM

    saved = resolved(*tiny_setup)
    current = {**saved, "train": {**saved["train"], key: value}}
    data = {"dir": "data", "split": "train", "tokens": 60_000, "fingerprint": "f", "stream": STREAM}
    changes = check_resume("checkpoints/step_00000004.ckpt", saved, current, data, data, 4)
    assert len(changes) == 1 and changes[0].startswith(f"train.{key} changed since step_00000004.ckpt "
                                                       f"({saved['train'][key]} -> {value}): the steps from 4 on"), changes
    assert changes[0] in capsys.readouterr().err
