"""Trends over training tokens (report/trends.py): the paired PPL gap at every validation point,
its slope against log10 tokens and the verdict, on constructed curves whose answers are known;
and the state's diagnostics figure on constructed diagnostics."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import trends
from stateloop.report.claims import judge, to_markdown
from stateloop.report.stats import t_interval
from support.reports import constructed_state

ROOT = Path(__file__).parents[2]
TOKENS = [2048 * 50 * i for i in range(1, 10)]  # nine validation points, as configs/decide.yaml's
WINDOWS = {"split": "val", "windows": 64, "seq_len": 128, "sha256": "ab" * 32}


def _write(results: Path, run, losses, windows=WINDOWS) -> None:
    folder = results / "runs" / run.id
    folder.mkdir(parents=True, exist_ok=True)
    curve = [{"step": t // 2048, "tokens": t, "loss": loss} for t, loss in zip(TOKENS, losses)]
    (folder / "train.json").write_text(json.dumps({"val_curve": curve, "val_windows": windows,
                                                   "final_val_loss": curve[-1]["loss"]}))
    (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": math.exp(curve[-1]["loss"])}, "tasks": {}}))


def _reference_loss(seed: int, t: int) -> float:
    """A falling learning curve that moves with the seed (its data order)."""
    return 3.0 + 0.05 * seed + 2.0 / math.log10(t)


def _loss_with_gap(ref_loss: float, gap_pct: float) -> float:
    """The loss whose PPL is gap_pct % above exp(ref_loss)."""
    return ref_loss + math.log1p(gap_pct / 100)


def _smoke(seeds=(1, 2, 3)):
    cfg = load_pipeline(ROOT / "configs" / "smoke.yaml")
    for name in ("table1", "table4", "loop_depth"):
        cfg.experiments[name] = dataclasses.replace(cfg.experiments[name], seeds=list(seeds))
    for name in ("state_width", "state_analysis", "decoding", "table1"):
        cfg.experiments.pop(name)
    return cfg


# Per seed: (the gap's intercept at 10^5 tokens, its slope per 10x tokens), in % PPL.
SHRINKING = {1: (6.0, -2.0), 2: (5.0, -1.6), 3: (7.0, -2.4)}
CONSTANT = {1: (4.0, 0.3), 2: (4.5, -0.2), 3: (3.5, -0.1)}  # slopes straddle 0
GROWING = {1: (2.0, 1.5), 2: (1.0, 1.0), 3: (3.0, 2.0)}


def _gap(shape: dict, seed: int, t: int) -> float:
    a, b = shape[seed]
    return a + b * (math.log10(t) - 5)


def test_shrinking_constant_and_growing_gaps_get_their_verdicts(tmp_path):
    """Table 4 (the smoke config's, K = 3) on three seeds: state-only's gap to StateLoop shrinks (slope -2 per 10x
    tokens on average), resetting's holds (per-seed slopes +0.3, -0.2, -0.1), the GRU's grows.
    The slope is fitted per seed, then a t interval over seeds: here every seed's gap is exactly
    linear in log10 tokens, so the seed slopes are known and so is the interval."""
    cfg = _smoke()
    results = tmp_path / "results"
    shapes = {"state_only": SHRINKING, "reset_state": CONSTANT, "stateloop_gru": GROWING}
    sl = {}
    for run in expand_runs(cfg, ["table4", "loop_depth"]):
        if run.model in ("stateloop", "vanilla_looped"):
            base = [_reference_loss(run.seed, t) + (0.01 * run.K if run.model == "stateloop" else 0) for t in TOKENS]
            _write(results, run, base)
            if run.model == "stateloop":
                sl[(run.K, run.seed)] = base
    for run in expand_runs(cfg, ["table4"]):
        if run.model in shapes:
            ref = sl[(run.K, run.seed)]
            _write(results, run, [_loss_with_gap(r, _gap(shapes[run.model], run.seed, t)) for r, t in zip(ref, TOKENS)])

    by_model = {c.model: c for c in trends.comparisons(cfg) if c.against == "stateloop"}
    verdicts = {}
    for model, shape in shapes.items():
        est, verdict, note = trends.measure(results, by_model[model])
        expected = t_interval([b for _, b in shape.values()])
        assert est.mean == pytest.approx(expected.mean, abs=1e-9) and est.lo == pytest.approx(expected.lo, abs=1e-9)
        assert est.n == 3 and "validation points" in note
        verdicts[model] = verdict
    assert verdicts == {"state_only": "shrinks", "reset_state": "holds (no trend resolved)", "stateloop_gru": "grows"}
    # The gap at each point, seed by seed, is the constructed one.
    curves = trends.gap_curves(results, by_model["state_only"])
    assert curves[2][TOKENS[3]] == pytest.approx(_gap(SHRINKING, 2, TOKENS[3]), rel=1e-9)

    # The claims: one row per comparison, marked as the project's own, with the trend's verdict.
    df = judge(cfg, results).set_index("id")
    rows = df[df.source.str.startswith("own: training tokens")]
    assert {rows.loc[by_model[m].id].verdict for m in shapes} == {"shrinks", "holds (no trend resolved)", "grows"}
    assert rows.loc[by_model["state_only"].id].ours == pytest.approx(-2.0)
    assert all(math.isnan(v) for v in rows.paper_effect) and set(rows.unit) == {trends.SLOPE_UNIT}
    # StateLoop loses by exactly 0.01 K nats at every point: a constant gap, no trend.
    sv = next(c for c in trends.comparisons(cfg) if c.against == "vanilla_looped" and c.ours[0].K == 3)
    assert rows.loc[sv.id].verdict == "holds (no trend resolved)" and rows.loc[sv.id].ours == pytest.approx(0, abs=1e-9)
    md = to_markdown(df.reset_index(), cfg, "c.yaml")
    assert "The project's own trends over training tokens: 1 shrinks, 1 grows" in md


@pytest.mark.parametrize("slopes, final, expected", [
    ([-2.0, -1.8, -2.2], 3.0, "shrinks"),     # a positive gap falling
    ([2.0, 1.8, 2.2], -3.0, "shrinks"),       # a negative gap rising toward 0
    ([2.0, 1.8, 2.2], 3.0, "grows"),
    ([-2.0, -1.8, -2.2], -3.0, "grows"),
    ([0.5, -0.4, 0.1], 3.0, "holds (no trend resolved)"),
    ([-2.0], 3.0, "holds (no trend resolved)"),  # one seed: no interval
])
def test_trend_verdict(slopes, final, expected):
    assert trends.trend_verdict(t_interval(slopes), final) == expected


def test_slope_by_hand():
    """Points (10^3, 1), (10^4, 3), (10^5, 2): x = 3, 4, 5, slope = sum (x - 4)(y - 2) / 2 = 0.5."""
    assert trends.fit_slope({10**3: 1.0, 10**4: 3.0, 10**5: 2.0}) == pytest.approx(0.5)


def test_runs_validated_on_other_windows_are_refused(tmp_path):
    cfg = _smoke(seeds=(1, 2))
    results = tmp_path / "results"
    for run in expand_runs(cfg, ["table4"]):
        other = dict(WINDOWS, sha256="cd" * 32) if run.model == "stateloop" and run.seed == 2 else WINDOWS
        _write(results, run, [_reference_loss(run.seed, t) for t in TOKENS], other)
    comp = next(c for c in trends.comparisons(cfg) if c.model == "stateloop" and c.against == "vanilla_looped")
    with pytest.raises(ValueError, match=r"seed2/train.json.*other held-out windows"):
        trends.gap_curves(results, comp)


def test_comparisons_of_the_decide_config():
    """configs/decide.yaml: StateLoop vs Vanilla Looped at K = 3..7 (K = 4 with Table 1's eight
    seeds; K = 7 once, Table 4's pair is Figure 2's) and Table 4's three ablations against StateLoop."""
    cfg = load_pipeline(ROOT / "configs" / "decide.yaml")
    comps = trends.comparisons(cfg)
    sv = {c.ours[0].K: c for c in comps if c.group == trends.GROUPS[0]}
    assert sorted(sv) == [3, 4, 5, 6, 7] and len(comps) == 8
    assert [r.seed for r in sv[4].ours] == list(range(1, 9)) and len(sv[3].ours) == 4
    assert sorted(c.model for c in comps if c.group == trends.GROUPS[2]) == ["reset_state", "state_only", "stateloop_gru"]
    assert all(c.ours[0].scale == "decide" for c in comps)  # read_init's scale is no comparison of the paper's


def test_the_figure_draws_each_comparisons_mean_gap_with_its_interval(tmp_path):
    """gap_vs_tokens on the constructed shrinking gap: per point, the mean over seeds and the t
    interval's half width as the error bar, on a log token axis; one panel per group."""
    import matplotlib.pyplot as plt

    from stateloop.report.figures import gap_vs_tokens

    cfg = _smoke()
    results = tmp_path / "results"
    for run in expand_runs(cfg, ["table4", "loop_depth"]):
        ref = [_reference_loss(run.seed, t) for t in TOKENS]
        gap = SHRINKING if run.model != "vanilla_looped" and run.model != "stateloop" else {s: (0.0, 0.0) for s in SHRINKING}
        _write(results, run, [_loss_with_gap(r, _gap(gap, run.seed, t)) if run.model not in ("stateloop", "vanilla_looped")
                              else r for r, t in zip(ref, TOKENS)])
    fig = gap_vs_tokens(cfg, results)
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert set(panels) == {trends.GROUPS[0], trends.GROUPS[2]}
    ablations = panels[trends.GROUPS[2]]
    assert ablations.get_xscale() == "log" and len(ablations.containers) == 3
    bars = ablations.containers[0]
    t = TOKENS[4]
    gaps = [_gap(SHRINKING, s, t) for s in (1, 2, 3)]
    assert bars.lines[0].get_ydata()[4] == pytest.approx(sum(gaps) / 3)
    seg = bars.lines[2][0].get_segments()[4]
    assert abs(seg[1][1] - seg[0][1]) / 2 == pytest.approx(t_interval(gaps).half_width, rel=1e-6)
    plt.close(fig)


def test_the_state_diagnostics_figure_draws_each_cells_mean_over_seeds(tmp_path):
    """state_diagnostics on constructed eval.json ``state`` blocks: per state index, the mean over
    seeds with its t interval; the GRU has no write rate and state-only no reads, so neither is
    drawn where it lacks the quantity; Vanilla Looped has no state and no line."""
    import matplotlib.pyplot as plt

    from stateloop.report.figures import DIAGNOSTIC_PANELS, state_diagnostics

    cfg = _smoke()
    results = tmp_path / "results"
    for run in expand_runs(cfg, ["table4", "loop_depth"]):
        folder = results / "runs" / run.id
        folder.mkdir(parents=True, exist_ok=True)
        ev = {"heldout": {"ppl": 10.0}, "tasks": {}}
        if run.model != "vanilla_looped":
            ev["state"] = constructed_state(run, tokens=100)
        (folder / "eval.json").write_text(json.dumps(ev))
    fig = state_diagnostics(cfg, results)
    axes = dict(zip((k for k, _ in DIAGNOSTIC_PANELS), fig.axes))
    labels = {key: [c.get_label() for c in ax.containers] for key, ax in axes.items()}
    assert "stateloop_gru K=3" not in labels["write_rate_mean"] and "stateloop_gru K=3" in labels["state_norm"]
    assert "state_only K=3" not in labels["read_ratio"] and "state_only K=3" in labels["write_rate_mean"]
    assert not any("vanilla" in label for ls in labels.values() for label in ls)
    sl = next(c for c in axes["write_rate_mean"].containers if c.get_label() == "stateloop K=3")
    seeds = sorted({r.seed for r in expand_runs(cfg, ["table4"])})
    per_seed = [0.1 * 2 + 0.01 * s for s in seeds]  # state 2
    assert sl.lines[0].get_ydata()[1] == pytest.approx(sum(per_seed) / len(per_seed))
    seg = sl.lines[2][0].get_segments()[1]
    assert abs(seg[1][1] - seg[0][1]) / 2 == pytest.approx(t_interval(per_seed).half_width, rel=1e-6)
    plt.close(fig)
