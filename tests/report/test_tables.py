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
