"""The recipe A/B (report/recipe.py, configs/decide.yaml's authors_lr_*): the verdict under the
authors' recipe with each model at its best lr, the project's recipe judged on the same lrs and
seeds, and what the recipe does to each model; on constructed perplexities whose answers are known.

The issue: "train StateLoop and Vanilla Looped at K = 4 and K = 7 under the authors' recipe (plain
init at the scale-appropriate std, their warm-up) and under the project's current recipe, with the
same paired seeds (at least four), at the lr bracket's best lr (9e-3) and at a third of it ...
report the StateLoop-vs-Vanilla gap under each recipe at each model's best lr, with its interval
... The same grid for both models; nothing tuned for StateLoop."
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import lr, recipe
from stateloop.report.claims import judge
from stateloop.report.stats import paired, relative_pct

ROOT = Path(__file__).parents[2]
NOISE = {1: 0.4, 2: -0.4, 3: 0.2, 4: -0.2, 5: 9.0}  # per seed, on the gap in points of %
# (recipe, lr) -> (Vanilla Looped's PPL, StateLoop's gap in %). The project's bracket has a third lr
# (1e-3) and a fifth seed, neither of which the A/B may read.
GRID = {("project", 1e-3): (22.0, -30.0), ("project", 3e-3): (25.0, 3.0), ("project", 9e-3): (24.0, 2.0),
        ("authors", 3e-3): (26.0, 4.0), ("authors", 9e-3): (27.0, -6.0)}


def _config(tmp_path: Path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    base = raw["scales"]["smoke"]
    scales, experiments = {}, {}
    for i, (rec, x) in enumerate(GRID):
        model = {**base["model"], "init_scheme": "plain"} if rec == "authors" else base["model"]
        scales[f"s{i}"] = {**base, "model": model, "train": {**base["train"], "lr": x, "min_lr": x / 10}}
        name = f"lr_{[1e-3, 3e-3, 9e-3].index(x) + 1}" if rec == "project" else f"authors_lr_{[3e-3, 9e-3].index(x) + 1}"
        experiments[name] = {"scale": f"s{i}", "models": ["vanilla_looped", "stateloop"], "K": [2],
                             "d_s": [32], "seeds": [1, 2, 3, 4, 5] if rec == "project" else [1, 2, 3, 4]}
    raw.update(scales=scales, experiments=experiments)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_pipeline(path)
    results = tmp_path / "results"
    for e, exp in cfg.experiments.items():
        key = ("authors" if e.startswith("authors") else "project", cfg.scales[exp.scale].train.lr)
        for run in expand_runs(cfg, [e]):
            base_ppl = GRID[key][0] + 0.1 * run.seed
            ppl = base_ppl * (1 + (GRID[key][1] + NOISE[run.seed]) / 100) if run.model == "stateloop" else base_ppl
            folder = results / "runs" / run.id
            folder.mkdir(parents=True)
            (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    return cfg, results


def test_the_authors_recipe_at_each_models_best_lr_against_the_projects_on_the_same_lrs_and_seeds(tmp_path):
    cfg, results = _config(tmp_path)
    assert recipe.experiments(cfg) == ["authors_lr_1", "authors_lr_2"] and recipe.loop_counts(cfg) == [2]
    authors, project = recipe.recipes(cfg, results, 2)
    assert [p.lr for p in authors] == [p.lr for p in project] == [3e-3, 9e-3]  # the project's 1e-3 is left out
    assert all(set(p.ppl[m]) == {1, 2, 3, 4} for p in authors + project for m in p.ppl)  # seed 5 is left out
    # Under the authors' recipe Vanilla is best at 3e-3 (26.x), StateLoop at 9e-3 (27.x x 0.94 < 26.x x 1.04).
    gap, note, verdict = recipe.measure(cfg, results, 2)
    hand = [100 * ((27.0 + 0.1 * s) * (1 + (-6.0 + NOISE[s]) / 100) / (26.0 + 0.1 * s) - 1) for s in (1, 2, 3, 4)]
    assert gap.mean == pytest.approx(math.fsum(hand) / 4) and gap.n == 4
    assert verdict == "reproduced" and gap.hi < 0
    # A misreading that judges both at one shared lr gives another effect (+4% at 3e-3, -6% at 9e-3).
    assert all(abs(gap.mean - p.gap.mean) > 1 for p in authors)
    # The project's recipe on the same lrs: both models best at 9e-3, gap +2% (its 1e-3 point, -30%, is not read).
    assert "The project's recipe at the same lrs and seeds: 2.00 [" in note
    # What the recipe does to Vanilla Looped: 26.x (authors, 3e-3) against 24.x (project, 9e-3).
    change = paired({s: 26.0 + 0.1 * s for s in (1, 2, 3, 4)}, {s: 24.0 + 0.1 * s for s in (1, 2, 3, 4)}, relative_pct)
    assert f"Vanilla Looped {change.format()}%" in note


def test_the_claims_row(tmp_path):
    cfg, results = _config(tmp_path)
    row = judge(cfg, results).set_index("id").loc["recipe_authors_verdict_K2"]
    assert row.source.startswith("own") and row.verdict == "reproduced" and row.n == 4
    assert "authors' recipe: lr 0.003: 4.00" in row.note and "best lr StateLoop 0.009, Vanilla Looped 0.003" in row.note


def test_no_row_without_the_authors_experiments(tmp_path):
    cfg, results = _config(tmp_path)
    cfg = replace(cfg, experiments={e: x for e, x in cfg.experiments.items() if not e.startswith("authors")})
    assert "recipe_authors_verdict_K2" not in set(judge(cfg, results).id)


def test_the_decide_config_runs_the_authors_recipe_on_the_projects_grid():
    """authors_lr_1/2 at the bracket's 3e-3 and 9e-3, both models, K = 4 and 7, four seeds; their
    scales differ from the project's at the same lr only in the init (plain, N(0, 0.02)) and the
    warm-up (2% of 450 steps, rounded up: 9)."""
    cfg = load_pipeline(ROOT / "configs" / "decide.yaml")
    assert recipe.experiments(cfg) == ["authors_lr_1", "authors_lr_2"] and recipe.loop_counts(cfg) == [4, 7]
    project = {cfg.scales[cfg.experiments[e].scale].train.lr: cfg.scales[cfg.experiments[e].scale] for e in lr.experiments(cfg)}
    for e in recipe.experiments(cfg):
        exp = cfg.experiments[e]
        assert sorted(exp.models) == ["stateloop", "vanilla_looped"] and exp.K == [4, 7] and exp.seeds == [1, 2, 3, 4]
        ours = cfg.scales[exp.scale]
        theirs = project[ours.train.lr]
        assert (ours.model.init_scheme, ours.model.init_std, theirs.model.init_scheme) == ("plain", 0.02, "depth_scaled")
        steps = ours.train.max_tokens // (ours.train.global_batch * ours.train.seq_len)
        assert ours.train.warmup_steps == math.ceil(0.02 * steps) == 9
        assert replace(ours.model, init_scheme=theirs.model.init_scheme) == theirs.model
        assert replace(ours.train, warmup_steps=theirs.train.warmup_steps) == theirs.train
        assert ours.data == theirs.data and ours.eval == theirs.eval
        # the project's side of the A/B has the same seeds at that lr (the bracket's runs)
        bracket = next(x for x in lr.experiments(cfg) if lr.lr_of(cfg, x) == ours.train.lr)
        assert set(exp.seeds) <= set(cfg.experiments[bracket].seeds)
