"""Test-time depth in the report: the figure's panels, lines and marks, and the own claim rows,
on constructed eval_depth.json files whose answers are known."""

import json
import math
from pathlib import Path

import pytest
import yaml

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import depth
from stateloop.report.claims import judge

ROOT = Path(__file__).parents[2]


def _config(tmp_path: Path, seeds=(1, 2, 3), Ks=(2, 3), depths=(1, 2, 3, 4, 6)) -> Path:
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    scale = next(iter(raw["scales"]))
    raw["experiments"] = {"test_time_depth": {"scale": scale, "models": ["vanilla_looped", "stateloop"], "K": list(Ks),
                                              "d_s": [raw["scales"][scale]["model"]["d_model"]],
                                              "seeds": list(seeds), "test_time_K": list(depths)}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _write(tmp_path, cfg, ppl):
    """eval_depth.json of every run: ppl(model, K, seed, K')."""
    for run in expand_runs(cfg):
        folder = tmp_path / "results" / "runs" / run.id
        folder.mkdir(parents=True)
        points = [{"K": k, "heldout": {"ppl": ppl(run.model, run.K, run.seed, k)}} for k in run.test_time_K]
        (folder / "eval_depth.json").write_text(json.dumps({"trained_K": run.K, "depths": points}))


def test_deepest_depth_beyond_the_trained_one():
    assert depth.deepest_beyond(3, [1, 2, 3, 4, 6, 8]) == 6  # 2K
    assert depth.deepest_beyond(3, [1, 2, 3, 4, 5]) == 5  # the deepest below 2K
    assert depth.deepest_beyond(4, [1, 2, 3, 4]) is None  # nothing past K
    assert depth.deepest_beyond(2, [1, 2, 8]) is None  # nothing past K within 2K


@pytest.mark.parametrize("stateloop_slope, expected", [
    (0.05, "reproduced"),    # StateLoop's PPL rises 5% per extra iteration, Vanilla's 20%: it degrades less
    (0.40, "contradicted"),  # StateLoop's rises faster
    (0.20, "inconclusive"),  # the same slope, seed noise only
])
def test_degrades_less_verdicts(tmp_path, stateloop_slope, expected):
    """Past the trained depth PPL grows by a fixed fraction per extra iteration; every seed
    multiplies its curve by its own level (the data order), which pairing by seed removes, and a
    small per-seed wobble keeps the interval open when the slopes are equal."""
    cfg = load_pipeline(_config(tmp_path))
    level = {1: 10.0, 2: 12.0, 3: 9.0}
    wobble = {1: 0.01, 2: -0.012, 3: 0.003}

    def ppl(model, K, seed, k):
        slope = stateloop_slope if model == "stateloop" else 0.20
        extra = max(k - K, 0) * (slope + (wobble[seed] if model == "stateloop" else 0.0))
        return level[seed] * (1 + extra) * (1 + 0.1 * max(K - k, 0))

    _write(tmp_path, cfg, ppl)
    df = judge(cfg, tmp_path / "results").set_index("id")
    for K in (2, 3):
        row = df.loc[f"test_time_depth_degrades_less_K{K}"]
        assert row.verdict == expected and row.n == 3 and row.source.startswith("own")
        star = 2 * K  # 4 and 6 are both evaluated
        assert f"K'={star} vs K={K}" in row.note
        want = 100 * K * (stateloop_slope - 0.20)
        if expected != "inconclusive":
            assert row.ours == pytest.approx(want, abs=100 * K * 0.02)


def test_no_rows_without_the_experiment(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    raw["experiments"] = {k: v for k, v in raw["experiments"].items() if k == "table4"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_pipeline(path)
    for run in expand_runs(cfg):
        folder = tmp_path / "results" / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": 10.0}, "tasks": {}}))
        (folder / "train.json").write_text(json.dumps({"val_curve": []}))  # the claims' trends over tokens read it
    df = judge(cfg, tmp_path / "results")
    assert not df.id.str.startswith("test_time_depth").any()


def test_figure_has_a_panel_per_model_a_line_per_trained_K_and_the_trained_depths_marked(tmp_path):
    cfg = load_pipeline(_config(tmp_path))
    _write(tmp_path, cfg, lambda model, K, seed, k: 10.0 + seed + abs(k - K) * (2 if model == "vanilla_looped" else 1))
    fig = depth.figure(cfg, tmp_path / "results")
    axes = fig.axes
    assert [a.get_title() for a in axes] == ["Vanilla Looped", "StateLoop"]
    for ax in axes:
        assert ax.get_xlabel() == "test-time loop depth K'" and ax.get_yscale() == "log"
        bars = list(ax.containers)  # one error-bar line per trained K
        assert [b.get_label() for b in bars] == ["trained K=2", "trained K=3"]
        for bar in bars:
            assert list(bar.lines[0].get_xdata()) == [1, 2, 3, 4, 6]
        stars = [l for l in ax.get_lines() if l.get_marker() == "*"]
        assert sorted(float(s.get_xdata()[0]) for s in stars) == [2.0, 3.0]
        # the star sits on its line's mean at the trained depth: seeds 1..3 give 10 + 2 on average
        assert all(math.isclose(float(s.get_ydata()[0]), 12.0) for s in stars)
    assert "mean and 95% CI over 3 seeds" in fig._suptitle.get_text()
    fig.canvas.draw()
    ticks = [t.get_text() for t in axes[0].get_xticklabels() if t.get_text()]
    assert ticks and all(t.lstrip("−-").isdigit() for t in ticks), ticks  # whole depths, no 2.5
    ylabels = [t.get_text() for t in axes[0].get_yticklabels() + axes[0].get_yticklabels(minor=True) if t.get_text()]
    assert ylabels and not any("times" in t or "^" in t for t in ylabels), ylabels  # no 1.2x10^1
    legend = axes[-1].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["trained K=2", "trained K=3", "trained depth"]


def test_figure_says_one_seed_has_no_interval(tmp_path):
    cfg = load_pipeline(_config(tmp_path, seeds=(1,)))
    _write(tmp_path, cfg, lambda model, K, seed, k: 10.0 + k)
    fig = depth.figure(cfg, tmp_path / "results")
    assert "one seed, no interval" in fig._suptitle.get_text()


def test_a_depth_the_model_cannot_run_is_refused_when_the_config_loads(tmp_path):
    from stateloop.config import ConfigError

    raw = yaml.safe_load(_config(tmp_path).read_text())
    scale = next(iter(raw["scales"]))
    raw["experiments"]["test_time_depth"]["models"] = ["mesh"]
    raw["experiments"]["test_time_depth"]["options"] = {"mesh": {"n_prelude": 1, "n_core": 1, "n_coda": 1}}
    raw["scales"][scale]["model"]["n_layers"] = 3
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"experiments\.test_time_depth\.test_time_K \(mesh, K=2\): mesh has no meaning at K=3"):
        load_pipeline(path)
