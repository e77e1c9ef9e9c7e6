"""The compute ladder (report/ladder.py, configs/ladder.yaml): the paired gap per rung, the fitted
trend against log10 FLOPs, its crossing of 0 with Fieller's interval, the figure and the claims
rows, on constructed perplexities whose answers are known."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import ladder
from stateloop.report.claims import judge

ROOT = Path(__file__).parents[2]
LOG_FLOPS = {"ladder_s": 11.0, "ladder_m": 12.0, "ladder_l": 13.0}  # constructed compute of each rung
NOISE = {1: 0.3, 2: -0.3, 3: 0.1, 4: -0.1, 5: 0.2, 6: -0.2}  # per seed, mean 0 on every rung


def _gap(K: int, x: float, seed: int) -> float:
    """K = 4: 3 - 2 (x - 12), crossing 0 at x = 13.5 (past the largest rung); K = 7: a flat 3%."""
    return (3.0 - 2.0 * (x - 12.0) if K == 4 else 3.0) + NOISE[seed] * (1 + 0.5 * (x - 12.0))


@pytest.fixture
def constructed(tmp_path, monkeypatch):
    cfg = load_pipeline(ROOT / "configs" / "ladder.yaml")
    monkeypatch.setattr(ladder, "training_flops", lambda cfg, run: 10 ** LOG_FLOPS[run.scale])
    monkeypatch.setattr(ladder, "paper_points", lambda: {4: (7.0e21, -2.31), 7: (2.9e21, -3.21)})
    results = tmp_path / "results"
    for run in expand_runs(cfg):
        base = 20.0 + 0.5 * run.seed + LOG_FLOPS[run.scale]
        ppl = base * (1 + _gap(run.K, LOG_FLOPS[run.scale], run.seed) / 100) if run.model == "stateloop" else base
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    return cfg, results


def test_the_ladder_config_plans_three_rungs_of_paired_seeds():
    cfg = load_pipeline(ROOT / "configs" / "ladder.yaml")
    assert ladder.rungs(cfg) == ["ladder_1", "ladder_2", "ladder_3"] and ladder.loop_counts(cfg) == [4, 7]
    runs = expand_runs(cfg)
    assert len(runs) == 3 * 2 * 2 * 6
    sizes = [(cfg.scales[s].model.d_model, cfg.scales[s].model.n_layers, cfg.scales[s].train.max_tokens)
             for s in ("ladder_s", "ladder_m", "ladder_l")]
    assert sizes == sorted(sizes) and len({x for s in sizes for x in s}) == 9  # width, depth and tokens all grow


@pytest.mark.parametrize("name", ["ladder.yaml", "ladder_gpu.yaml"])
def test_a_ladders_rehearsal_keeps_its_rungs_order_of_compute(name):
    """`stateloop rehearse` shrinks every scale to one width; a ladder's rungs must still grow in
    training compute, or the rehearsed fit has no compute axis (on 2026-12-04 all three rungs of
    ladder_gpu.yaml's rehearsal trained alike and its slope read -17,053 points per tenfold)."""
    from stateloop.config import load_yaml
    from stateloop.experiments import pipeline_from_dict
    from stateloop.ops.rehearse.config import shrink

    raw = shrink(load_yaml(ROOT / "configs" / name))
    cfg = pipeline_from_dict(raw, name)
    flops = [ladder.training_flops(cfg, next(r for r in expand_runs(cfg, [rung]) if r.model == "stateloop" and r.K == 4))
             for rung in ladder.rungs(cfg)]
    assert len(flops) == 3 and flops[0] < flops[1] < flops[2]


def test_the_fit_and_its_crossing_against_independent_computations(constructed):
    cfg, results = constructed
    tr = ladder.trend(cfg, results, 4)
    xs = [math.log10(r.flops) for r in tr.rungs for _ in r.gaps]
    ys = [g for r in tr.rungs for g in r.gaps.values()]
    ref = st.linregress(xs, ys)
    assert tr.fit.slope == pytest.approx(ref.slope) and tr.fit.intercept == pytest.approx(ref.intercept)
    t = st.t.ppf(0.975, len(xs) - 2)
    assert tr.slope.half_width == pytest.approx(t * ref.stderr) and tr.slope.mean == pytest.approx(-2.0, abs=1e-9)
    x0, lo, hi = tr.cross
    assert x0 == pytest.approx(13.5, abs=1e-9) and lo < 13.5 < hi
    # Fieller's interval is the set of x whose fitted gap the 95% band does not tell from 0: by brute force.
    grid = np.linspace(10, 20, 200001)
    inside = [x for x in grid if abs(tr.fit.predict(x)) <= t * tr.fit.se(x)]
    assert min(inside) == pytest.approx(lo, abs=1e-4) and max(inside) == pytest.approx(hi, abs=1e-4)
    assert tr.verdict == "shrinks"  # a positive gap with a negative slope
    flat = ladder.trend(cfg, results, 7)
    assert flat.cross is None and flat.crossing_text() == ladder.NO_CROSSING
    assert flat.verdict == "holds (no trend resolved)" and flat.slope.mean == pytest.approx(0.0, abs=1e-9)


def test_a_crossing_outside_the_rungs_says_so():
    """The 2026-12-04 ladder's K = 4 fit grew and crossed 0 at 10^10.45, below its smallest rung
    (1.3e11 FLOPs): a crossing the ladder never reaches as compute grows."""
    rungs = [ladder.Rung(f"ladder_{i}", 10.0 ** x, {1: 0.0}) for i, x in ((1, 11.1), (2, 12.1), (3, 12.9))]

    def text(x: float) -> str:
        return ladder.Trend(4, rungs, None, (x, x - 1.0, x + 1.0)).crossing_text()

    assert text(10.45).endswith("below the smallest rung (10^11.10): the fit run backwards")
    assert text(13.5).endswith("past the largest rung (10^12.90): an extrapolation")
    assert text(12.0) == "the fitted gap crosses 0 at 10^12.00 [10^11.00, 10^13.00] training FLOPs"


def test_the_claims_rows_and_the_figure(constructed):
    import matplotlib.pyplot as plt

    from stateloop.report.figures import gap_vs_compute

    cfg, results = constructed
    df = judge(cfg, results).set_index("id")
    k4, k7 = df.loc["ladder_gap_vs_compute_K4"], df.loc["ladder_gap_vs_compute_K7"]
    assert k4.source.startswith("own: compute ladder") and k4.verdict == "shrinks" and k4.n == 18
    assert "crosses 0 at 10^13.50" in k4.note and k7.verdict == "holds (no trend resolved)"
    assert ladder.NO_CROSSING in k7.note
    fig = gap_vs_compute(cfg, results)
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and len(ax.containers) == 2  # one errorbar line per K
    means = ax.containers[0].lines[0].get_ydata()
    assert list(means) == pytest.approx([5.0, 3.0, 1.0])  # K = 4's mean gap per rung (the seeds' noise averages out)
    stars = sorted(tuple(p) for c in ax.collections for p in c.get_offsets() if c.get_offsets().shape[0] == 1)
    assert (2.9e21, -3.21) in stars and (7.0e21, -2.31) in stars
    plt.close(fig)


def test_the_papers_points_are_table1_and_table4_at_their_runs_training_compute(monkeypatch):
    """1.4B StateLoop vs Vanilla Looped at K = 4 (Table 1: 7.61 vs 7.79 PPL) and 410M at K = 7
    (Table 4: 9.04 vs 9.34), each at the training FLOPs of configs/paper.yaml's run (the FLOP
    count itself, minutes of tracing at these shapes, is stubbed: per sequence x sequences)."""
    seen = []

    def stub(cfg, run):
        seen.append(run.id)
        t = cfg.scales[run.scale].train
        return 1e9 * run.model_config.d_model * t.total_steps * t.global_batch

    monkeypatch.setattr(ladder, "training_flops", stub)
    points = ladder.paper_points.__wrapped__()
    assert seen == ["1.4b/stateloop/K4_ds2048_seed1234", "410m/stateloop/K7_ds1024_seed1234"]
    assert points[4][1] == pytest.approx(100 * (7.61 / 7.79 - 1)) and points[7][1] == pytest.approx(100 * (9.04 / 9.34 - 1))
    assert points[4][0] == pytest.approx(1e9 * 2048 * 30e9 / 2048, rel=1e-3)  # 30B tokens in 2,048-token sequences


# An lr bracket per rung (configs/overlays/ladder_lr.yaml): each model's PPL factor at each peak lr,
# chosen so that the two models' best lrs differ on two rungs and lie at the grid's edge on two.
FACTOR = {
    "ladder_1": {"vanilla_looped": {3e-3: 1.30, 9e-3: 1.00, 2.7e-2: 1.10, 8.1e-2: 1.20},
                 "stateloop": {3e-3: 1.40, 9e-3: 1.06, 2.7e-2: 1.02, 8.1e-2: 1.01}},
    "ladder_2": {"vanilla_looped": {1e-3: 1.20, 3e-3: 1.00, 9e-3: 1.04, 2.7e-2: 1.30},
                 "stateloop": {1e-3: 1.25, 3e-3: 1.03, 9e-3: 1.05, 2.7e-2: 1.20}},
    "ladder_3": {"vanilla_looped": {1e-3: 1.00, 3e-3: 1.02, 9e-3: 1.30}, "stateloop": {1e-3: 1.09, 3e-3: 1.04, 9e-3: 1.20}},
}


@pytest.fixture
def bracketed(tmp_path, monkeypatch):
    cfg = load_pipeline(ROOT / "configs" / "overlays" / "ladder_lr.yaml")  # its base: ladder.yaml
    monkeypatch.setattr(ladder, "training_flops", lambda cfg, run: 10 ** LOG_FLOPS[run.scale.split("_lr")[0]])
    rung_of = {s: f"ladder_{i}" for i, size in enumerate(("ladder_s", "ladder_m", "ladder_l"), 1)
               for s in cfg.scales if s.split("_lr")[0] == size}
    results = tmp_path / "results"
    for run in expand_runs(cfg):
        seed_base = 30.0 + 2.0 * run.seed  # shared by both models at every lr: the pairing is by seed
        if run.K == 4:
            ppl = seed_base * FACTOR[rung_of[run.scale]][run.model][cfg.scales[run.scale].train.lr]
        else:  # K = 7: the ladder's own single lr, a flat 3% gap
            ppl = seed_base * (1.03 if run.model == "stateloop" else 1.0)
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    return cfg, results


def test_the_lr_overlay_adds_a_bracket_per_rung_that_changes_only_the_lr():
    """The overlay's points are the rungs' own scales with another peak lr (min_lr a tenth of it),
    at K = 4, the same models and seeds as the rung."""
    base = load_pipeline(ROOT / "configs" / "ladder.yaml")
    cfg = load_pipeline(ROOT / "configs" / "overlays" / "ladder_lr.yaml")  # its base: ladder.yaml, merged under it
    assert ladder.rungs(cfg) == ladder.rungs(base) and len(expand_runs(cfg)) == len(expand_runs(base)) + 8 * 2 * 6
    for name in ladder.rungs(cfg):
        own = cfg.scales[cfg.experiments[name].scale]
        lrs = set()
        for point in ladder.bracket_names(cfg, name)[1:]:
            exp = cfg.experiments[point]
            other = cfg.scales[exp.scale]
            assert exp.K == [4] and exp.seeds == cfg.experiments[name].seeds and exp.models == cfg.experiments[name].models
            assert other.model == own.model and other.data == own.data and other.eval == own.eval
            t, t0 = vars(other.train), vars(own.train)
            assert {k for k in t if t[k] != t0[k]} == {"lr", "min_lr"} and t["min_lr"] == pytest.approx(t["lr"] / 10)
            lrs.add(t["lr"])
        assert len(lrs) >= 2 and own.train.lr not in lrs  # at least three distinct lrs per rung


def test_a_rungs_gap_takes_each_model_at_its_own_best_lr(bracketed):
    cfg, results = bracketed
    tr = ladder.trend(cfg, results, 4)
    want = {"ladder_1": 100 * (1.01 / 1.00 - 1), "ladder_2": 100 * (1.03 / 1.00 - 1), "ladder_3": 100 * (1.04 / 1.00 - 1)}
    for rung in tr.rungs:
        # every seed: StateLoop at its best lr over Vanilla at its own (the seed's base cancels)
        assert list(rung.gaps) == [1, 2, 3, 4, 5, 6]
        assert all(g == pytest.approx(want[rung.name]) for g in rung.gaps.values()), rung.name
    r1, r2, r3 = tr.rungs
    assert (r1.best_lr["stateloop"], r1.best_lr["vanilla_looped"]) == (8.1e-2, 9e-3)
    assert (r3.best_lr["stateloop"], r3.best_lr["vanilla_looped"]) == (3e-3, 1e-3)
    # the misreading: both models at the rung's own lr (3e-3), the ladder's one point, reads rung 3
    # as +2%, not the +4% of each model at its own best
    from stateloop.report import lr

    (own,) = lr.bracket(cfg, results, 4, ("ladder_3",))
    assert own.gap.mean == pytest.approx(100 * (1.04 / 1.02 - 1)) and own.gap.mean != pytest.approx(r3.gaps[1])
    assert "stateloop at the grid's edge" in r1.best_text() and "not bracketed" not in r2.best_text()
    assert "vanilla_looped at the grid's edge" in r3.best_text()
    assert r2.best_text() == "best lr of 0.001, 0.003, 0.009, 0.027: StateLoop 0.003, Vanilla Looped 0.003"
    # K = 7 has one lr per rung: the rung's own gap, no bracket
    flat = ladder.trend(cfg, results, 7)
    assert all(r.lrs == (3e-3,) and r.best_text() == "" for r in flat.rungs)
    assert all(g == pytest.approx(3.0) for r in flat.rungs for g in r.gaps.values())


def test_the_claims_note_names_each_rungs_best_lrs(bracketed):
    cfg, results = bracketed
    row = judge(cfg, results).set_index("id").loc["ladder_gap_vs_compute_K4"]
    assert row.n == 18 and "ladder_3" in row.note
    assert "best lr of 0.001, 0.003, 0.009: StateLoop 0.003, Vanilla Looped 0.001 (vanilla_looped at the grid's edge" in row.note
