"""Rendering: ours beside the paper's numbers, never the paper's numbers in our column."""

import math

import pandas as pd
import pytest

from stateloop.report.stats import t_interval
from stateloop.report.tables import put, reference, to_markdown


def test_cells_print_mean_interval_and_the_paper_apart():
    row = {"model": "stateloop", "seeds": 3}
    put(row, "pile_ppl", t_interval([9.4, 9.5, 9.6]), 7.61, comparable=True)
    put(row, "lambada_openai_ppl", math.nan, 6.71)
    put(row, "wikitext2_word_ppl", 20.0, 16.2, comparable=False)
    df = pd.DataFrame([row])
    assert math.isclose(df.pile_ppl_diff[0], 9.5 - 7.61)
    assert math.isnan(df.wikitext2_word_ppl_diff[0]) and df.wikitext2_word_ppl_paper[0] == 16.2
    md = to_markdown(df, ["a note"], "Table 1")
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert f"| stateloop | 3 | 9.50 [{9.5 - half:.2f}, {9.5 + half:.2f}] (paper 7.61, +1.89) | - (paper 6.71) | 20.00 (paper 16.20) |" in md
    assert "a note" in md


def test_reference_tables_are_the_papers():
    t4 = reference("table4_ablations")
    assert t4.set_index(["ablation", "variant"]).loc[("update_rule", "stateloop_gru")].pile_ppl == 9.09
    assert len(reference("table2_accuracy")) == 20


def _fake_evals(cfg, results, experiment: str) -> None:
    """An eval.json with a made-up held-out PPL for every run of an experiment."""
    import json

    from stateloop.experiments import expand_runs

    for i, run in enumerate(expand_runs(cfg, [experiment])):
        folder = results / "runs" / run.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": 10.0 + i}, "tasks": {}}))


def test_table1_overheads_from_exact_counts_and_compute_per_token(tmp_path):
    """Table 1's parameter overhead against Vanilla Looped comes from exact counts (at the smoke
    scale, counts rounded to 0.01M put it off by whole points), and each row shows its compute:
    layer applications per token and training FLOPs per token against Vanilla."""
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.models.registry import count_params
    from stateloop.report.tables import table1

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    _fake_evals(cfg, tmp_path, "table1")
    df, notes = table1(cfg, tmp_path)
    # smoke is not the paper's scale: no "ours - paper" on absolute numbers, only on relative ones
    assert df.params_m_diff.isna().all() and df.pile_ppl_diff.isna().all()
    assert not df.params_vs_vanilla_pct_diff.isna().any()
    sl = df.set_index("model").loc["stateloop"]
    assert math.isclose(sl.pile_ppl_vs_vanilla_pct, 100 * (sl.pile_ppl / df.set_index("model").loc["vanilla_looped"].pile_ppl - 1))
    assert math.isclose(sl.pile_ppl_vs_vanilla_pct_paper, 100 * (7.61 / 7.79 - 1))
    exact = {run.model: count_params(run.model_config) for run in expand_runs(cfg, ["table1"])}
    rows = df.set_index("model")
    worst_rounding = 0.0
    for model, n in exact.items():
        pct = 100 * (n / exact["vanilla_looped"] - 1)
        assert math.isclose(rows.loc[model].params_vs_vanilla_pct, pct, rel_tol=1e-12, abs_tol=1e-12)
        rounded = 100 * (round(n / 1e6, 2) / round(exact["vanilla_looped"] / 1e6, 2) - 1)
        worst_rounding = max(worst_rounding, abs(rounded - pct))
    assert worst_rounding > 0.5  # the old computation was visibly wrong at this scale
    K, L = 2, cfg.scales["smoke"].model.n_layers
    assert rows.loc["vanilla_looped"].layer_apps_per_token == K * L
    assert rows.loc["vanilla_looped"].flops_vs_vanilla_pct == 0
    assert rows.loc["pause_token"].flops_vs_vanilla_pct > 0  # K-1 pauses per token: longer attention
    assert any("layer_apps_per_token" in n for n in notes)


@pytest.mark.slow
def test_compute_per_token_at_the_papers_shapes():
    """Table 1's baselines at the paper's 1.4B shapes: Vanilla Looped applies its 24 layers K = 4
    times (96 per token); Hyperloop's 6 begin + 12 middle x 4 loops + 6 end layers are 60 per
    token, so it spends less compute than the models it is compared with."""
    import dataclasses
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.models.flops import compute_profile

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "paper.yaml")
    runs = {r.model: r for r in expand_runs(cfg, ["table1"]) if r.model in ("vanilla_looped", "hyperloop")}
    prof = {m: compute_profile(dataclasses.replace(r.model_config, max_seq_len=256), 256) for m, r in runs.items()}
    assert prof["vanilla_looped"].layer_applications_per_token == 96
    assert prof["hyperloop"].layer_applications_per_token == 60
    assert prof["hyperloop"].flops_per_token < 0.7 * prof["vanilla_looped"].flops_per_token


def test_figure3_labels_each_point_with_its_state_width_and_ppl(tmp_path):
    """Paper, Figure 3: the points are labelled with d_s and their PPL."""
    from pathlib import Path

    from stateloop.experiments import load_pipeline
    from stateloop.report.figures import state_width

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    for experiment in ("state_width", "table4"):
        _fake_evals(cfg, tmp_path, experiment)
    fig = state_width(cfg, tmp_path)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels and all(text.startswith("d_s=") and "\nPPL " in text for text in labels)


def test_paper_scale_compares_absolute_numbers(tmp_path):
    """At a scale marked paper: true, Table 4's absolute PPL is set against the paper's."""
    from pathlib import Path

    from stateloop.experiments import load_pipeline
    from stateloop.report.tables import table4

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    _fake_evals(cfg, tmp_path, "table4")
    df, _ = table4(cfg, tmp_path)
    assert df.pile_ppl_diff.isna().all()
    cfg.scales["smoke"].paper = True
    df, notes = table4(cfg, tmp_path)
    assert not df.pile_ppl_diff.isna().any() and "not the paper's" not in " ".join(notes)


def test_table2_has_a_chance_row_and_lm_evals_standard_error(tmp_path):
    """Multiple-choice tables show each task's chance level (measured from the examples lm-eval
    scored) and the accuracy's standard error."""
    import json
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.report.tables import table2

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    for i, run in enumerate(expand_runs(cfg, ["table1"])):
        folder = tmp_path / "runs" / run.id
        folder.mkdir(parents=True)
        block = {"metrics": {"acc": 0.40 + i / 100, "acc_stderr": 0.05}, "chance": 0.3125}
        ev = {"heldout": {"ppl": 10.0}, "tasks": {"synth_mc": {"column": "synth_mc", "reported": {"accuracy": "acc"},
                                                               "shots": {"0": block}}}}
        (folder / "eval.json").write_text(json.dumps(ev))
    df, _ = table2(cfg, tmp_path)
    chance = df[df.model == "chance"].iloc[0]
    assert chance.synth_mc == 31.25 and math.isnan(chance.synth_mc_diff)
    sl = df[df.model == "stateloop"].iloc[0]
    assert sl.synth_mc_se == 5.0
    assert math.isclose(sl.avg_vs_vanilla_pts, sl.avg - df[df.model == "vanilla_looped"].iloc[0].avg)


def test_figures_draw_seed_intervals_and_keep_the_papers_points_off_our_axis(tmp_path):
    """Figure 2 with three seeds per point: error bars over seeds on our axis; the paper's 410M
    numbers (a PPL advantage of 0.14 and 0.30) only on a twin axis of their own."""
    import dataclasses
    import json
    from pathlib import Path

    from stateloop.experiments import expand_runs, load_pipeline
    from stateloop.report.figures import loop_depth

    cfg = load_pipeline(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    cfg.experiments["loop_depth"] = dataclasses.replace(cfg.experiments["loop_depth"], seeds=[1, 2, 3])
    for run in expand_runs(cfg, ["loop_depth"]):
        folder = tmp_path / "runs" / run.id
        folder.mkdir(parents=True)
        ppl = 30.0 + run.seed + (-1.0 if run.model == "stateloop" else 0.0)
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    fig = loop_depth(cfg, tmp_path)
    ours, adv, paper = fig.axes
    assert len(ours.containers) == 2  # one errorbar container per model
    bars = ours.containers[0].lines[2][0].get_segments()  # vertical error segments of the first curve
    half = [abs(seg[1][1] - seg[0][1]) / 2 for seg in bars]
    assert all(math.isclose(h, 4.302653 * 1.0 / math.sqrt(3), rel_tol=1e-5) for h in half)  # sd 1 over seeds 1..3
    paper_y = sorted(float(y) for coll in paper.collections for _, y in coll.get_offsets())
    assert paper_y == [0.14, 0.30]
    ours_y = [float(y) for line in ours.lines + adv.lines for y in line.get_ydata()]
    assert 0.14 not in ours_y and 0.30 not in ours_y
