"""Parameter counts of the paper's runs, from `stateloop params` (meta device), to two decimals in M."""

import csv
import io
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from stateloop.cli import main

ROOT = Path(__file__).resolve().parents[2]

PAPER = {  # (scale, model, K, d_s) -> millions, as printed in the paper
    ("1.4b", "vanilla_looped", 4, 0): 1420.92,
    ("1.4b", "vanilla_looped_ffn", 4, 0): 1467.22,
    ("1.4b", "hyperloop", 4, 0): 1421.32,
    ("1.4b", "mesh", 10, 0): 1421.51,
    ("1.4b", "ponderlm", 4, 0): 1420.92,
    ("1.4b", "parcae", 10, 0): 1429.32,
    ("1.4b", "pause_token", 4, 0): 1420.92,
    ("1.4b", "stateloop", 4, 2048): 1437.71,
    ("1.4b", "stateloop_attn", 4, 2048): 1454.49,
    ("1.4b", "stateloop_mamba2", 4, 2048): 1467.23,
    ("410m", "vanilla_looped", 7, 0): 406.90,
    ("410m", "stateloop", 7, 1024): 411.10,
    ("410m", "state_only", 7, 1024): 409.00,
    ("410m", "reset_state", 7, 1024): 411.10,
    ("410m", "stateloop_gru", 7, 1024): 416.34,
}


@pytest.fixture(scope="module")
def rows():
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["params", "--config", str(ROOT / "configs/paper.yaml")]) == 0
    reader = csv.DictReader(io.StringIO(buf.getvalue()))
    assert reader.fieldnames == ["run", "model", "scale", "K", "d_s", "params"]
    return {(r["scale"], r["model"], int(r["K"]), int(r["d_s"])): int(r["params"]) for r in reader}


@pytest.mark.parametrize("key", sorted(PAPER))
def test_paper_counts(rows, key):
    assert key in rows, f"configs/paper.yaml does not define the run {key}"
    assert round(rows[key] / 1e6, 2) == PAPER[key]


def test_state_width_runs_of_figure3(rows):
    """StateLoop at d_s = 128..1024 adds 4 d d_s + 3 d_s + d to the 410M vanilla model."""
    vanilla = rows[("410m", "vanilla_looped", 7, 0)]
    for d_s in (128, 256, 512, 1024):
        assert rows[("410m", "stateloop", 7, d_s)] - vanilla == 4 * 1024 * d_s + 3 * d_s + 1024


def test_every_run_once_and_loop_depth_does_not_change_counts(rows):
    for K in (3, 4, 5, 6, 7):
        assert rows[("410m", "stateloop", K, 1024)] == rows[("410m", "stateloop", 7, 1024)]
        assert rows[("410m", "vanilla_looped", K, 0)] == rows[("410m", "vanilla_looped", 7, 0)]


def test_bad_config_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scales: {s: {model: {d_modle: 3}}}\n")
    assert main(["params", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "scales.s.model.d_modle: unknown key" in err and "\n" not in err
