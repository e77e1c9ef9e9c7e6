"""The precision A/B (report/precision.py, configs/decide.yaml's precision_bf16): the verdict when both
models train in bf16-mixed, against the float32 runs of the same models, loop counts and seeds;
on constructed perplexities whose answers are known.

The issue: "Measure what the choice does: at the decide scale ... the float32 recipe against the
paper runs' precision policy: does the verdict move? Report the paired gaps with intervals."
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import precision
from stateloop.report.claims import judge
from stateloop.report.stats import paired, relative_pct

ROOT = Path(__file__).parents[2]
SEEDS = (1, 2, 3, 4)
NOISE = {1: 0.5, 2: -0.5, 3: 0.3, 4: -0.3}  # per seed, on the gap in points of %
# precision -> (Vanilla Looped's PPL, StateLoop's gap in %). A third scale at another lr, also in
# float32, must not be taken for the float32 side.
GRID = {"32-true": (24.0, 3.0), "bf16-mixed": (24.6, -2.0)}
DECOY = (20.0, -40.0)


def _config(tmp_path: Path):
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    base = raw["scales"]["smoke"]
    train = {**base["train"], "precision": "32-true"}
    raw["scales"] = {"f32": {**base, "train": train}, "bf16": {**base, "train": {**train, "precision": "bf16-mixed"}},
                     "decoy": {**base, "train": {**train, "lr": train["lr"] * 3}}}
    pair = {"models": ["vanilla_looped", "stateloop"], "K": [2], "d_s": [32], "seeds": list(SEEDS)}
    raw["experiments"] = {"lr_2": {"scale": "f32", **pair}, "precision_bf16": {"scale": "bf16", **pair},
                          "other": {"scale": "decoy", **pair}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_pipeline(path)
    results = tmp_path / "results"
    for run in expand_runs(cfg):
        vanilla, gap = GRID[cfg.scales[run.scale].train.precision] if run.scale != "decoy" else DECOY
        base_ppl = vanilla + 0.1 * run.seed
        ppl = base_ppl * (1 + (gap + NOISE[run.seed]) / 100) if run.model == "stateloop" else base_ppl
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    return cfg, results


def _hand(precision_name: str) -> dict[int, float]:
    vanilla, gap = GRID[precision_name]
    return {s: 100 * ((vanilla + 0.1 * s) * (1 + (gap + NOISE[s]) / 100) / (vanilla + 0.1 * s) - 1) for s in SEEDS}


def test_the_gap_in_bf16_against_float32_on_the_same_seeds(tmp_path):
    cfg, results = _config(tmp_path)
    assert precision.loop_counts(cfg) == [2] and precision.float32_scale(cfg, "bf16") == "f32"
    gap, note, verdict = precision.measure(cfg, results, 2)
    bf16, f32 = _hand("bf16-mixed"), _hand("32-true")
    assert gap.mean == pytest.approx(math.fsum(bf16.values()) / 4) and gap.n == 4
    assert verdict == "reproduced" and gap.hi < 0  # -2% under bf16-mixed
    f32_est = paired(f32, {s: 0.0 for s in SEEDS}, lambda a, b: a - b)
    assert f"float32 on the same seeds: {f32_est.format()}% (contradicted)" in note  # +3% in float32
    shift = paired(bf16, f32)
    assert shift.mean == pytest.approx(-5.0) and f"bf16-mixed minus float32: {shift.format()} points" in note
    vanilla = paired({s: 24.6 + 0.1 * s for s in SEEDS}, {s: 24.0 + 0.1 * s for s in SEEDS}, relative_pct)
    assert f"Vanilla Looped {vanilla.format()}%" in note
    # The misreading that takes any float32 scale (the decoy's -40% at another lr) would read another gap.
    assert "-40" not in note


def test_the_claims_row_and_none_without_the_experiment(tmp_path):
    cfg, results = _config(tmp_path)
    row = judge(cfg, results).set_index("id").loc["precision_bf16_verdict_K2"]
    assert row.source.startswith("own") and row.verdict == "reproduced" and row.n == 4
    cfg = replace(cfg, experiments={e: x for e, x in cfg.experiments.items() if e != "precision_bf16"})
    assert "precision_bf16_verdict_K2" not in set(judge(cfg, results).id)


def test_a_bf16_scale_without_its_float32_twin_is_named(tmp_path):
    cfg, results = _config(tmp_path)
    cfg = replace(cfg, scales={k: v for k, v in cfg.scales.items() if k != "f32"},
                  experiments={e: x for e, x in cfg.experiments.items() if e != "lr_2"})
    with pytest.raises(KeyError, match="no scale of the config equals bf16 in float32"):
        precision.measure(cfg, results, 2)


def test_the_decide_config_runs_the_ab_on_the_float32_runs_seeds():
    """precision_bf16: both models, K = 4, four seeds, at a scale that is decide's with
    train.precision bf16-mixed and nothing else changed; decide's float32 runs of the same cells
    and seeds exist (lr_2's)."""
    cfg = load_pipeline(ROOT / "configs" / "decide.yaml")
    exp = cfg.experiments[precision.EXPERIMENT]
    assert sorted(exp.models) == ["stateloop", "vanilla_looped"] and exp.seeds == [1, 2, 3, 4] and exp.K == [4]
    assert precision.float32_scale(cfg, exp.scale) == "decide"
    assert cfg.scales[exp.scale].train.precision == "bf16-mixed"
    f32 = {r.id for r in expand_runs(cfg, ["lr_2"])}
    assert {replace(r, scale="decide").id for r in expand_runs(cfg, [precision.EXPERIMENT])} <= f32
