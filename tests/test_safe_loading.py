"""Loading a file never runs code. A run's final weights are ``model.safetensors``, read with no
unpickler at all (a pickled ``model.pt`` beside them is never opened); a checkpoint whose pickle
carries a payload is refused (one line naming the file), a resume passes over such a checkpoint,
and a YAML config with a ``!!python`` tag is refused too. The payload would create a marker file;
it never appears."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import torch

from stateloop.cli import main
from stateloop.config import ConfigError, to_dict
from stateloop.models.registry import build_model
from stateloop.runs import FINAL_WEIGHTS, load_model, save_final
from support.models import tiny_config
from support.threads import _one_thread  # noqa: F401  (autouse fixture)


class Payload:
    """Unpickling this runs ``touch MARKER`` (in a pickle loaded with weights_only=False)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def pickled_run(tmp_path: Path, marker: Path) -> Path:
    """A real-looking run folder whose only weights are a pickled model.pt that holds a payload."""
    cfg = tiny_config("vanilla_looped", vocab_size=97, max_seq_len=64)
    run_dir = tmp_path / "runs" / "test" / "vanilla_looped" / "K3_ds0_seed1234"
    config = {"run": {"id": "test/vanilla_looped/K3_ds0_seed1234", "scale": "test"}, "model": to_dict(cfg)}
    run_dir.mkdir(parents=True)
    torch.save({"model": build_model(cfg).state_dict(), "config": config, "extra": Payload(marker)}, run_dir / "model.pt")
    return run_dir


def assert_refused(err: str, path: Path) -> None:
    line = err.strip()
    assert len(line.splitlines()) == 1, line
    assert str(path) in line and "not a safe weights file" in line and "refusing to load it" in line, line
    assert "system" in line, line  # names what the file would have called


def test_the_payload_is_real(tmp_path):
    """The unsafe unpickler does run it (so the tests below prove something)."""
    marker = tmp_path / "FIRED"
    torch.save({"x": Payload(marker)}, tmp_path / "p.pt")
    torch.load(tmp_path / "p.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("argv", [
    ["eval", "{run}", "--no-progress", "--no-mlflow", "--tasks"],
    ["analyze", "shapley", "{run}", "--no-mlflow"],
    ["analyze", "interventions", "{run}", "--no-mlflow"],
    ["bench", "decode", "--runs", "{run}", "--device", "cpu", "--out", "{tmp}/decode.json"],
], ids=["eval", "analyze-shapley", "analyze-interventions", "bench-decode"])
def test_commands_never_open_a_pickled_model_pt(tmp_path, capsys, argv):
    marker = tmp_path / "MARKER"
    run_dir = pickled_run(tmp_path, marker)
    args = [a.format(run=run_dir, tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stateloop {args[0]}: error: ") and "no final weights" in err, err
    assert not marker.exists()
    assert not (tmp_path / "decode.json").exists()


@pytest.mark.slow
def test_resume_passes_over_a_malicious_checkpoint(tmp_path, monkeypatch, capsys):
    """The newest checkpoint carries a payload (with a matching sha256 sidecar): the resume warns,
    naming it, and continues from the previous one; loading it directly is refused."""
    from stateloop.files import atomic_write_json
    from stateloop.train.checkpoint import CheckpointStore
    from stateloop.train.loop import train
    from support.training import resolved, write_config, write_shards

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = write_shards(tmp_path / "data", n_train=20_000, n_val=2_000)
    cfg = resolved(write_config(tmp_path / "cfg.yaml", train={"max_steps": 8, "val_every": 0}), data)
    run_dir = tmp_path / "run"
    train(cfg, run_dir, progress=False)  # checkpoints at 4 and 8
    store = CheckpointStore(run_dir / "checkpoints")
    assert store.steps() == [8, 4]
    # Every checkpoint the code writes loads with the safe unpickler.
    saved = torch.load(store.path(8), map_location="cpu", weights_only=True)
    assert isinstance(saved["rng"]["numpy"]["key"], torch.Tensor) and isinstance(saved["rng"]["python"], list)

    marker = tmp_path / "MARKER"
    saved["rng"]["evil"] = Payload(marker)
    ckpt = store.path(8)
    torch.save(saved, ckpt)
    from stateloop.data.shards import sha256_file

    atomic_write_json(store.sidecar(ckpt), {"sha256": sha256_file(ckpt), "bytes": ckpt.stat().st_size, "step": 8})
    assert "not a safe weights file" in store.verify(8)
    assert store.latest() == store.path(4)
    with pytest.raises(ConfigError) as err:  # loading it directly (fabric.load) is refused too
        store.load_into(_FakeFabric(), ckpt, {})
    assert_refused(str(err.value), ckpt)
    assert not marker.exists()

    (run_dir / FINAL_WEIGHTS).unlink()
    capsys.readouterr()
    result = train(cfg, run_dir, progress=False)
    err = capsys.readouterr().err
    assert f"{ckpt}: not a safe weights file" in err and "using the previous checkpoint step_00000004.ckpt" in err, err
    assert result.summary["resumed_from_step"] == 4
    assert store.verify(8) is None  # rewritten in the safe format
    assert not marker.exists()


class _FakeFabric:
    def load(self, path, state, weights_only=None):
        return torch.load(path, map_location="cpu", weights_only=weights_only)


def test_a_yaml_config_with_a_python_tag_is_refused(tmp_path, capsys):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f"scales: !!python/object/apply:os.system [{json.dumps('touch ' + shlex.quote(str(marker)))}]\n")
    assert main(["plan", "--config", str(evil)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(evil) in err and "python/object/apply:os.system" in err, err
    # ... and as a run folder's config.yaml
    cfg = tiny_config("vanilla_looped", vocab_size=97, max_seq_len=64)
    run_dir = tmp_path / "runs" / "ok"
    save_final(run_dir, build_model(cfg).eval(), {"model": to_dict(cfg), "data": {"dir": str(tmp_path)}})
    (run_dir / "config.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(run_dir / "config.yaml") in err, err
    assert not marker.exists()


def test_final_weights_are_safetensors_read_without_any_unpickler(tmp_path, monkeypatch):
    """save_final writes model.safetensors (the resolved config a JSON string in its metadata);
    load_model rebuilds the model from it with every unpickler of the process disabled."""
    import pickle

    from safetensors import safe_open

    cfg = tiny_config("stateloop", vocab_size=97, max_seq_len=64)
    model = build_model(cfg).eval()
    config = {"model": to_dict(cfg), "data": {"dir": str(tmp_path)}, "train": {"seq_len": 16}}
    path = save_final(tmp_path / "run", model, config)
    assert path.name == "model.safetensors"
    with safe_open(str(path), "pt") as fh:
        assert json.loads(fh.metadata()["stateloop_config"]) == config

    def refuse(*args, **kwargs):
        raise AssertionError("an unpickler ran")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    loaded, saved = load_model(tmp_path / "run")
    assert saved == config
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_truncated_or_foreign_safetensors_file_is_one_line(tmp_path, capsys):
    from safetensors.torch import save_file

    cfg = tiny_config("vanilla_looped", vocab_size=97, max_seq_len=64)
    run_dir = tmp_path / "run"
    path = save_final(run_dir, build_model(cfg).eval(), {"model": to_dict(cfg), "data": {"dir": str(tmp_path)}})
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ConfigError, match=rf"^{path}: cannot be read \(SafetensorError: "):
        load_model(run_dir)
    save_file({"x": torch.zeros(2)}, str(path), metadata={"format": "pt"})  # someone else's weights
    assert main(["eval", str(run_dir), "--no-progress", "--no-mlflow", "--tasks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{path}: not a stateloop weights file (no stateloop_config JSON in its metadata)" in err, err
