"""The command line speaks one dialect (issue 16, item 6): one spelling for the output path and
for quiet runs across every command, unknown names refused, `none` read as unset."""

import argparse

import pytest

from stateloop.cli import build_parser


def _options(parser: argparse.ArgumentParser) -> dict[str, set[str]]:
    """command (and subcommand) -> its option strings."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for inner, opts in _options(sub).items():
                    out[f"{name} {inner}".strip()] = opts
    out[""] = {s for a in parser._actions for s in a.option_strings}
    return out


def test_every_command_spells_output_and_progress_one_way():
    """`--out PATH` for what a command writes, `--no-progress` for a quiet run: never `--output`,
    `--quiet` (lm-eval's own options, passed through unchanged, are lm-eval's)."""
    options = _options(build_parser())
    assert {"eval", "analyze shapley", "analyze interventions", "bench decode", "params", "plan", "tokenize", "train",
            "render"} <= set(options)
    for command, opts in options.items():
        assert not opts & {"--output", "--quiet", "--progress", "--output-dir"}, (command, opts)
    writes = {"analyze shapley", "analyze interventions", "bench decode", "params", "plan", "tokenize", "train", "render",
              "schema", "rehearse"}
    assert {c for c, o in options.items() if "--out" in o} == writes
    assert {c for c, o in options.items() if "--no-progress" in o} == {"eval", "analyze shapley", "analyze interventions",
                                                                      "bench decode", "tokenize", "train"}


def test_an_unknown_state_update_is_refused():
    from stateloop.models.config import ModelConfig
    from stateloop.models.looped import StateLoopLM

    cfg = ModelConfig(vocab_size=32, n_layers=1, d_model=16, d_ff=32, n_heads=2, head_dim=8, max_seq_len=16, K=2, d_state=8)
    with pytest.raises(ValueError, match=r"unknown state update 'gur' \(known: ssm, gru\)"):
        StateLoopLM(cfg, update="gur")
    assert type(StateLoopLM(cfg, update="gru").cell).__name__ == "GRUStateCell"


@pytest.mark.parametrize("spelling", ["none", "None", "null"])
def test_none_on_the_command_line_unsets_a_number(spelling):
    from stateloop.commands.tokenize import resolve

    args = build_parser().parse_args(["tokenize", "--out", "x", "--max-docs", spelling])
    data, _ = resolve(args)
    assert data.max_docs is None
    args = build_parser().parse_args(["tokenize", "--out", "x", "--max-docs", "12"])
    assert resolve(args)[0].max_docs == 12


def test_building_the_parser_imports_no_heavy_library():
    """`stateloop --help` and every command's parser start without torch, lightning or mlflow
    (stateloop/cli.py: command modules import them inside run)."""
    import subprocess
    import sys

    code = ("import sys, stateloop.cli; stateloop.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'lightning_fabric', 'mlflow', 'lm_eval') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
