"""An experiment's own comparison (report/compare.py, figures.comparison): each model's held-out
PPL per seed and its paired change against the experiment's baseline, with the interval and
verdict of Table 1's claims, computed by the claims' own functions; and Figure 2's form where the
experiment varies K. The experiment is a file of its own over smoke.yaml (`base:`)."""

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from stateloop.config import ConfigError
from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import claims, stats
from stateloop.report.outputs import baseline_of, comparison_files, comparisons, varies_K

ROOT = Path(__file__).parents[2]
SEEDS = (1, 2, 3)
# held-out PPL of each (model, K) at seed 1; each further seed adds its own offset. The idea is
# 2% better than Vanilla at K = 2 on every seed (an interval excluding 0); at K = 3 it is better on
# two seeds and worse on one (an interval containing 0).
PPL = {("vanilla_looped", 2): 40.0, ("vanilla_looped", 3): 38.0, ("stateloop_gru", 2): 40.0 * 0.98}
K3_IDEA = {1: 37.0, 2: 40.5, 3: 36.5}


def overlay(tmp_path: Path, K=(2, 3), models=("vanilla_looped", "stateloop_gru"), extra: str = "") -> Path:
    """An experiment of its own over configs/smoke.yaml, in a file of its own."""
    path = tmp_path / "idea.yaml"
    path.write_text(f"base: {ROOT / 'configs' / 'smoke.yaml'}\n"
                    f"experiments:\n  idea:\n    scale: smoke\n    models: [{', '.join(models)}]\n"
                    f"    K: [{', '.join(map(str, K))}]\n    d_s: [32]\n    seeds: [{', '.join(map(str, SEEDS))}]\n{extra}")
    return path


def ppl(run) -> float:
    if (run.model, run.K) == ("stateloop_gru", 3):
        return K3_IDEA[run.seed]
    return PPL[(run.model, run.K)] + 0.5 * run.seed


def write_results(cfg, results: Path) -> None:
    for run in expand_runs(cfg, ["idea"]):
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl(run)}, "tasks": {}}))


def test_an_experiment_of_two_models_is_compared_with_vanilla_by_default(tmp_path):
    from stateloop.report.compare import compare, to_markdown

    cfg = load_pipeline(overlay(tmp_path))
    assert "idea" in comparisons(cfg) and baseline_of(cfg, "idea") == "vanilla_looped" and varies_K(cfg, "idea")
    assert not {"table1", "table4", "loop_depth", "state_width", "state_analysis"} & set(comparisons(cfg))
    write_results(cfg, tmp_path / "results")
    df = compare(cfg, tmp_path / "results", "idea")
    assert list(zip(df.model, df.K)) == [("vanilla_looped", 2), ("vanilla_looped", 3), ("stateloop_gru", 2), ("stateloop_gru", 3)]
    for _, row in df.iterrows():
        runs = [r for r in expand_runs(cfg, ["idea"]) if r.model == row.model and r.K == row.K]
        assert [row[f"ppl_seed{s}"] for s in SEEDS] == [ppl(r) for r in runs]  # every seed's own PPL
        assert math.isclose(row.ppl, stats.t_interval([ppl(r) for r in runs]).mean)
    base = df[df.model == "vanilla_looped"]
    assert (base.verdict == "baseline").all() and base.effect_pct.isna().all()
    for K, verdict in ((2, "better"), (3, "inconclusive")):
        row = df[(df.model == "stateloop_gru") & (df.K == K)].iloc[0]
        # the claims' own functions give the same effect and interval (no second copy of the statistics)
        ours = claims.experiment_cell(cfg, "idea", "stateloop_gru", K)
        est, note = claims.ppl_gap(tmp_path / "results", ours, claims.experiment_cell(cfg, "idea", "vanilla_looped", K))
        assert (row.effect_pct, row.ci_lo, row.ci_hi, row.n) == (est.mean, est.lo, est.hi, 3) and row.note == note
        seeds = {s: 100 * (ppl(r) / ppl(v) - 1) for r, v, s in zip(ours, claims.experiment_cell(cfg, "idea", "vanilla_looped", K), SEEDS)}
        assert math.isclose(row.effect_pct, sum(seeds.values()) / 3)  # paired: each seed's change, then the mean
        assert row.verdict == verdict
    assert math.isclose(df[(df.model == "stateloop_gru") & (df.K == 2)].iloc[0].effect_pct, -2.0, abs_tol=0.1)
    md = to_markdown(df, cfg, "idea", "idea.yaml")
    assert md.startswith("# Comparison: idea") and "against **vanilla_looped**" in md
    assert "| PPL seed 1 | PPL seed 2 | PPL seed 3 |" in md and "1 better, 0 worse, 1 inconclusive" in md
    assert "| stateloop_gru | 2 | 32 | 39.70 | 40.20 | 40.70 |" in md and "**better**" in md


def test_a_named_baseline_and_a_missing_one(tmp_path):
    cfg = load_pipeline(overlay(tmp_path, models=("stateloop", "stateloop_gru"), extra="    baseline: stateloop\n"))
    assert baseline_of(cfg, "idea") == "stateloop"
    no_vanilla = load_pipeline(overlay(tmp_path, models=("stateloop", "stateloop_gru")))  # trains, plans as any config
    with pytest.raises(ConfigError, match=r"experiments\.idea\.baseline: missing: .*add `baseline: stateloop`"):
        comparisons(no_vanilla)  # asked by the Snakefile when it checks the config (common.smk), before any job
    with pytest.raises(ConfigError, match=r"experiments\.idea\.baseline: 'mesh' is not one of its models"):
        load_pipeline(overlay(tmp_path, extra="    baseline: mesh\n"))


def test_render_writes_the_table_and_the_figure_in_figure_twos_form(tmp_path, capsys):
    """`stateloop render compare --experiment idea`: the table (CSV + Markdown) and, as the
    experiment varies K, the figure: panel (a) each model's PPL over seeds per K, panel (b) the
    idea's advantage over Vanilla paired by seed, as Figure 2 draws StateLoop's."""
    from stateloop.cli import main
    from stateloop.report.figures import comparison

    config = overlay(tmp_path)
    cfg = load_pipeline(config)
    results = tmp_path / "results"
    write_results(cfg, results)
    table, figure = (tmp_path / f for f in comparison_files("idea")), (tmp_path / f for f in comparison_files("idea", True))
    csv, md = table
    pdf, png = figure
    common = ["--config", str(config), "--results", str(results), "--no-mlflow", "--experiment", "idea"]
    assert main(["render", "compare", *common, "--out", str(csv)]) == 0
    assert main(["render", "compare", *common, "--out", str(pdf)]) == 0
    assert pd.read_csv(csv).verdict.tolist() == ["baseline", "baseline", "better", "inconclusive"]
    assert md.read_text().startswith("# Comparison: idea") and pdf.stat().st_size > 0 and png.read_bytes()[:4] == b"\x89PNG"
    fig = comparison(cfg, results, "idea")
    ours, adv = fig.axes
    assert [t.get_text() for t in ours.get_legend().get_texts()] == ["vanilla_looped", "stateloop_gru"]
    (curve,) = [c for c in adv.containers]
    ys = list(curve.lines[0].get_ydata())
    expected = [stats.paired({s: PPL[("vanilla_looped", K)] + 0.5 * s for s in SEEDS},
                             {s: ppl(r) for s, r in zip(SEEDS, claims.experiment_cell(cfg, "idea", "stateloop_gru", K))},
                             stats.relative_pct).mean for K in (2, 3)]
    assert ys == pytest.approx(expected) and ys[0] > 0  # above 0: lower PPL than the baseline
    # one K: no figure, and a figure asked for says so
    one_K = load_pipeline(overlay(tmp_path, K=(2,)))
    assert not varies_K(one_K, "idea")
    capsys.readouterr()
    assert main(["render", "compare", *common, "--out", str(pdf)]) != 0
    assert "experiment idea does not vary K: its comparison is a table (--out .csv)" in capsys.readouterr().err
    assert main(["render", "compare", *common[:-1], "table1", "--out", str(csv)]) != 0
    assert "'table1' has no comparison of its own" in capsys.readouterr().err
