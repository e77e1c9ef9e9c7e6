"""Golden loss curves: every registered model (2 layers, K = 3; configs/tiny.yaml's baseline
options) trains 6 steps of a tiny run through `train()`, and
each step's loss must equal, bit for bit, the curve recorded in golden_losses.json before the
design pass (issue 16: "a tiny run's loss curve bitwise identical before and after (record one as
a golden file first, as torchtitan keeps golden losses)").

Floats are compared exactly, so a recording belongs to one torch build and one set of CPU kernels.
The curves are trained in a child process with torch's and MKL's kernels pinned to AVX2
(:data:`PINNED`), so that every x86-64 machine with AVX2 runs the same instructions: unpinned, an
AMD EPYC with AVX512 and an Intel Xeon with AVX512 differed by one ulp in Mamba-2's fourth loss
(2026-12-04), while pinned, an AVX2-only machine, that Xeon and that EPYC gave the same 13
curves. The file keeps one recording per kind (``recordings``: torch build, machine, the child's
CPU capability), and the test compares against this machine's, or skips, saying why, where there
is none (another torch, an ARM machine). Re-record only for an intended change of the numbers (or
to add this machine's kind, from code whose numbers have not changed since the others):

    python tests/train/test_golden.py --record
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_losses.json"
STEPS = 6
# ATen's vectorised kernels and MKL's, pinned to AVX2 in the child that trains (module docstring)
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "1"}


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


def _pinned_curves(tmp: Path) -> tuple[dict, dict[str, list[float]]]:
    """(the child's machine kind, its curves): :func:`_curves` in a fresh process under :data:`PINNED`
    (the pins are read when torch and MKL load, so they cannot be set in this process)."""
    out = tmp / "curves.json"
    env = {**os.environ, **PINNED, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp / 'mlflow.db'}"}
    proc = subprocess.run([sys.executable, __file__, "--curves", str(out)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    return result["machine"], result["curves"]


def test_loss_curves_equal_the_golden_file(tmp_path):
    machine, curves = _pinned_curves(tmp_path)
    mine = [r for r in _recordings() if r["recorded_on"] == machine]
    if not mine:
        kinds = [r["recorded_on"] for r in _recordings()]
        pytest.skip(f"golden losses were recorded on {kinds}, this is {machine}: exact floats differ across builds")
    (golden,) = mine
    assert golden["curves"].keys() <= curves.keys(), "a recorded run is no longer trained"
    new = sorted(curves.keys() - golden["curves"].keys())
    if new:  # a model added since: `--record` adds it (docs/adding-a-model.md)
        warnings.warn(f"not in this machine's golden recording (run with --record): {', '.join(new)}", stacklevel=1)
    for run, curve in golden["curves"].items():
        assert curves[run] == curve, f"{run}: {curves[run]} != golden {curve}"


if __name__ == "__main__" and "--curves" in sys.argv:  # the child of _pinned_curves
    sys.path.insert(0, str(HERE))
    out = Path(sys.argv[sys.argv.index("--curves") + 1])
    torch.set_num_threads(1)
    curves = _curves(out.parent)
    out.write_text(json.dumps({"machine": _machine(), "curves": curves}))

if __name__ == "__main__" and "--record" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        machine, curves = _pinned_curves(Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout.strip()
    others = [r for r in _recordings() if r["recorded_on"] != machine]
    entry = {"recorded_on": machine, "commit": commit, "steps": STEPS, "curves": curves}
    GOLDEN.write_text(json.dumps({"recordings": others + [entry]}, indent=1) + "\n")
    print(f"{GOLDEN}: {len(curves)} curves of {STEPS} steps on {machine} (commit {commit}); {len(others)} other recording(s) kept")
