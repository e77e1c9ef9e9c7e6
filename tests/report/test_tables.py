"""Rendering: ours beside the paper's numbers, never the paper's numbers in our column."""

import math

import pandas as pd

from stateloop.report.tables import _side_by_side, reference, to_markdown


def test_side_by_side_keeps_columns_apart_when_ours_lacks_a_quantity():
    ours = pd.DataFrame([{"model": "stateloop", "pile_ppl": 9.5}, {"model": "unknown_model", "pile_ppl": 10.0}])
    df = _side_by_side(ours, reference("table1_ppl"), ["model"], ["pile_ppl", "lambada_openai_ppl"])
    row = df.set_index("model").loc["stateloop"]
    assert row.pile_ppl == 9.5 and row.pile_ppl_paper == 7.61 and math.isclose(row.pile_ppl_diff, 9.5 - 7.61)
    assert math.isnan(row.lambada_openai_ppl) and row.lambada_openai_ppl_paper == 6.71
    assert math.isnan(df.set_index("model").loc["unknown_model"].pile_ppl_paper)
    md = to_markdown(df, ["a note"], "Table 1")
    assert "| stateloop | 9.50 (7.61, +1.89) | - (6.71) |" in md and "a note" in md


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
