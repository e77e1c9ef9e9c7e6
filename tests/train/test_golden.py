"""Golden loss curves: every registered model (2 layers, K = 3; configs/tiny.yaml's baseline
options) trains 6 steps of a tiny run through `train()`, and
each step's loss must equal, bit for bit, the curve recorded in golden_losses.json before the
design pass (issue 16: "a tiny run's loss curve bitwise identical before and after (record one as
a golden file first, as torchtitan keeps golden losses)").

Floats are compared exactly, so each recording belongs to one torch build and CPU kind: the file
keeps one per machine kind (``recordings``), and the test compares against this machine's, or
skips, saying why, where there is none. Re-record only for an intended change of the numbers (or
to add this machine's kind, from code whose numbers have not changed since the others):

    python tests/train/test_golden.py --record
"""

from __future__ import annotations

import json
import platform
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_losses.json"
STEPS = 6


def _machine() -> dict:
    return {"torch": torch.__version__, "machine": platform.machine(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _curves(tmp: Path) -> dict[str, list[float]]:
    """run id -> per-step training loss of each registered model (K = 3, d_s = 32)."""
    import yaml
    from train_support import TINY_MODEL, TINY_TRAIN, write_shards

    from stateloop import tracking
    from stateloop.models.registry import MODELS
    from stateloop.pipeline import expand_runs, load_pipeline, resolve_run
    from stateloop.train.loop import train

    data = write_shards(tmp / "data")
    cfg = tmp / "golden.yaml"
    cfg.write_text(yaml.safe_dump({
        "scales": {"t": {"model": {**TINY_MODEL, "n_layers": 2, "mamba_head_dim": 16, "mamba_n_groups": 2, "mamba_d_state": 8,
                                   "mamba_chunk_size": 8},
                         "train": {**TINY_TRAIN, "max_steps": STEPS, "log_every": 1, "val_tokens": 0, "checkpoint_every": 0}}},
        "experiments": {"golden": {"scale": "t", "models": list(MODELS), "K": [3], "d_state": [32], "seeds": [1234], "options": {
            "hyperloop": {"n_begin": 1, "n_middle": 1, "n_end": 1, "n_streams": 4},
            "mesh": {"n_prelude": 1, "n_core": 1, "n_coda": 1}, "parcae": {"n_prelude": 1, "n_core": 1, "n_coda": 1},
            "pause_token": {"pause_id": 95}}}}}))
    losses: dict[int, float] = {}
    log = tracking.Tracker.log_metrics

    def recording(self, metrics, step):
        if "train/loss" in metrics:
            losses[step] = metrics["train/loss"]
        return log(self, metrics, step)

    tracking.Tracker.log_metrics = recording
    try:
        out = {}
        for run in expand_runs(load_pipeline(cfg)):
            losses.clear()
            train(resolve_run(cfg, run.id, [], data), tmp / run.id, progress=False)
            out[run.id] = [losses[s] for s in range(1, STEPS + 1)]
        return out
    finally:
        tracking.Tracker.log_metrics = log


def _recordings() -> list[dict]:
    data = json.loads(GOLDEN.read_text())
    return data["recordings"]


def test_loss_curves_equal_the_golden_file(tmp_path, monkeypatch):
    mine = [r for r in _recordings() if r["recorded_on"] == _machine()]
    if not mine:
        kinds = [r["recorded_on"] for r in _recordings()]
        pytest.skip(f"golden losses were recorded on {kinds}, this is {_machine()}: exact floats differ across builds")
    (golden,) = mine
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    torch.set_num_threads(1)
    curves = _curves(tmp_path)
    assert golden["curves"].keys() <= curves.keys(), "a recorded run is no longer trained"
    new = sorted(curves.keys() - golden["curves"].keys())
    if new:  # a model added since: `--record` adds it (docs/adding-a-model.md)
        warnings.warn(f"not in this machine's golden recording (run with --record): {', '.join(new)}", stacklevel=1)
    for run, curve in golden["curves"].items():
        assert curves[run] == curve, f"{run}: {curves[run]} != golden {curve}"


if __name__ == "__main__" and "--record" in sys.argv:
    import os
    import tempfile

    sys.path.insert(0, str(HERE))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        torch.set_num_threads(1)
        curves = _curves(Path(tmp))
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    others = [r for r in _recordings() if r["recorded_on"] != _machine()]
    entry = {"recorded_on": _machine(), "commit": commit, "steps": STEPS, "curves": curves}
    GOLDEN.write_text(json.dumps({"recordings": others + [entry]}, indent=1) + "\n")
    print(f"{GOLDEN}: {len(curves)} curves of {STEPS} steps on {_machine()} (commit {commit}); {len(others)} other recording(s) kept")
