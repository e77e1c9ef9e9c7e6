"""The learning-rate bracket (report/lr.py, configs/decide.yaml's lr_1..lr_4): each lr's paired gap
and claim verdict, each model's best lr, the row's verdict (holding at every lr, or changing), on
constructed perplexities whose answers are known; and the bracket the decide config plans.

The request: "run three peak lrs ... paired seeds; report each model's best lr and whether the verdict
changes with lr (a claims row: "the verdict holds at every lr tried" or which lr flips it). Do not
tune for StateLoop: the same grid for both models."
"""

import json
import math
from pathlib import Path

import pytest
import yaml

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import lr
from stateloop.report.claims import judge
from stateloop.report.stats import paired, relative_pct

ROOT = Path(__file__).parents[2]
LRS = (1e-3, 3e-3, 9e-3)
NOISE = {1: 0.4, 2: -0.4, 3: 0.0}  # per seed, on the gap in points of %


def _config(tmp_path: Path) -> object:
    """The smoke scale at three peak lrs, StateLoop and Vanilla Looped at K = 2 and 3, three seeds."""
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    base = raw["scales"]["smoke"]
    raw["scales"] = {f"s{i}": {**base, "train": {**base["train"], "lr": x, "min_lr": x / 10}} for i, x in enumerate(LRS)}
    raw["experiments"] = {f"lr_{i + 1}": {"scale": f"s{i}", "models": ["vanilla_looped", "stateloop"], "K": [2, 3],
                                          "d_s": [32], "seeds": [1, 2, 3]} for i in range(len(LRS))}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_pipeline(path)


# Vanilla Looped's PPL is lowest at 3e-3 for both K; StateLoop's at 9e-3 for K = 3, 3e-3 for K = 2.
VANILLA = {1e-3: 30.0, 3e-3: 25.0, 9e-3: 27.0}
GAP = {2: {1e-3: 4.0, 3e-3: 3.0, 9e-3: 2.0},  # contradicted at every lr
       3: {1e-3: 3.0, 3e-3: 0.0, 9e-3: -12.0}}  # contradicted, inconclusive, reproduced


def _write(cfg, results: Path) -> None:
    for run in expand_runs(cfg):
        x = cfg.scales[run.scale].train.lr
        base = VANILLA[x] + 0.1 * run.seed
        ppl = base * (1 + (GAP[run.K][x] + NOISE[run.seed]) / 100) if run.model == "stateloop" else base
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))


@pytest.fixture
def constructed(tmp_path):
    cfg = _config(tmp_path)
    results = tmp_path / "results"
    _write(cfg, results)
    return cfg, results


def test_each_lr_has_its_paired_gap_and_verdict(constructed):
    cfg, results = constructed
    assert lr.experiments(cfg) == ["lr_1", "lr_2", "lr_3"] and lr.loop_counts(cfg) == [2, 3]
    points = lr.bracket(cfg, results, 3)
    assert [p.lr for p in points] == list(LRS)
    for p in points:
        assert p.gap.mean == pytest.approx(GAP[3][p.lr], abs=1e-9) and p.gap.n == 3
    assert [p.verdict for p in points] == ["contradicted", "inconclusive", "reproduced"]


def test_verdict_holds_or_names_the_lrs_where_it_changes(constructed):
    cfg, results = constructed
    assert lr.verdict(lr.bracket(cfg, results, 2)) == "holds at every lr tried (contradicted)"
    changed = lr.verdict(lr.bracket(cfg, results, 3))
    assert changed == "changes with lr: contradicted at lr 0.001; inconclusive at lr 0.003; reproduced at lr 0.009"


def test_each_model_is_compared_at_its_own_best_lr(constructed):
    """Vanilla Looped is best at 3e-3; StateLoop at K = 3 at 9e-3, where its PPL is 27 x 0.88
    (below 25 x 1.00): the row's effect pairs those two, seed by seed."""
    cfg, results = constructed
    points = lr.bracket(cfg, results, 3)
    assert lr.best(points, "vanilla_looped").lr == 3e-3 and lr.best(points, "stateloop").lr == 9e-3
    by_lr = {p.lr: p for p in points}
    expected = paired(by_lr[9e-3].ppl["stateloop"], by_lr[3e-3].ppl["vanilla_looped"], relative_pct)
    assert lr.tuned_gap(points) == expected
    hand = [100 * ((27.0 + 0.1 * s) * (1 + (-12.0 + NOISE[s]) / 100) / (25.0 + 0.1 * s) - 1) for s in (1, 2, 3)]
    assert expected.mean == pytest.approx(math.fsum(hand) / 3)
    # A misreading that compares both at one shared lr (decide's own, 3e-3) gives another effect.
    assert lr.tuned_gap(points).mean != pytest.approx(by_lr[3e-3].gap.mean, abs=0.5)


def test_the_claims_rows(constructed):
    cfg, results = constructed
    df = judge(cfg, results).set_index("id")
    k2, k3 = df.loc["lr_verdict_K2"], df.loc["lr_verdict_K3"]
    assert k2.verdict == "holds at every lr tried (contradicted)" and k3.verdict.startswith("changes with lr: ")
    assert k2.source.startswith("own") and "Best lr: StateLoop 0.003, Vanilla Looped 0.003" in k2.note
    assert "lr 0.009: -12.00" in k3.note and k3.n == 3


def test_two_points_with_one_lr_are_refused(tmp_path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    raw["experiments"] = {f"lr_{i}": {"scale": "smoke", "models": ["vanilla_looped", "stateloop"], "K": [2],
                                      "d_s": [32], "seeds": [1, 2]} for i in (1, 2)}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_pipeline(path)
    results = tmp_path / "results"
    _write_flat(cfg, results)
    with pytest.raises(ValueError, match="share a peak lr"):
        lr.bracket(cfg, results, 2)


def _write_flat(cfg, results: Path) -> None:
    for run in expand_runs(cfg):
        folder = results / "runs" / run.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": 20.0 + run.seed}, "tasks": {}}))


def test_the_decide_config_brackets_its_own_lr_with_the_same_grid_for_both_models():
    """lr_2 is decide's own lr, its runs Figure 2's (no retraining); lr_1, lr_3 and lr_4 are a third,
    three and nine times it, min_lr a tenth of the peak; the scales differ in nothing else."""
    cfg = load_pipeline(ROOT / "configs" / "decide.yaml")
    assert lr.experiments(cfg) == ["lr_1", "lr_2", "lr_3", "lr_4"] and lr.loop_counts(cfg) == [4, 7]
    peaks = [lr.lr_of(cfg, e) for e in lr.experiments(cfg)]
    assert peaks == pytest.approx([1e-3, 3e-3, 9e-3, 2.7e-2])
    scales = [cfg.scales[cfg.experiments[e].scale] for e in lr.experiments(cfg)]
    assert all(s.train.min_lr == pytest.approx(s.train.lr / 10) for s in scales)
    from dataclasses import replace

    middle = scales[1]
    for s in scales:
        assert s.model == middle.model and s.data == middle.data and s.eval == middle.eval
        assert replace(s.train, lr=middle.train.lr, min_lr=middle.train.min_lr) == middle.train
    for e in lr.experiments(cfg):
        assert sorted(cfg.experiments[e].models) == ["stateloop", "vanilla_looped"]  # the same grid for both
    assert {r.id for r in expand_runs(cfg, ["lr_2"])} <= {r.id for r in expand_runs(cfg, ["loop_depth"])}
    # Six seeds at 9e-3, both models' best lr, where three did not tell them apart; four at decide's own
    # lr (Figure 2's runs, for the recipe A/B's four paired seeds); three elsewhere.
    assert [cfg.experiments[e].seeds for e in lr.experiments(cfg)] == [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 3]]
