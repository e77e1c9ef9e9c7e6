"""Every flag of every command is declared once, as a field of the command's typed request
(config.arg): the parser is built from the fields (commands.add_flags), with their help, and the
parsed flags are the request, typed (issue 54)."""

import argparse
import ast
import dataclasses
import importlib
from pathlib import Path

import pytest

from stateloop.cli import main
from stateloop.commands import COMMANDS, build_parser, run_command
from stateloop.config import flag_of

COMMANDS_DIR = Path(__file__).resolve().parents[1] / "src" / "stateloop" / "commands"
DECLARED = [name for name, (module, _) in COMMANDS.items() if hasattr(importlib.import_module(module), "Request")]


def _parsers(command: str) -> dict[str, argparse.ArgumentParser]:
    """The command's parsers: "analyze shapley" ... for a command with subcommands, else the command's own."""
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return {f"{command} {name}": p for name, p in subs[0].choices.items()} if subs else {command: top}


def _shown(f: dataclasses.Field) -> str:
    """How --help names a field: its flag, a positional's metavar or its choices."""
    choices = f.metadata.get("choices")
    return "{" + ",".join(choices) + "}" if f.metadata.get("positional") and choices else flag_of(f)


def _fields(command: str) -> list[dataclasses.Field]:
    request = importlib.import_module(COMMANDS[command][0]).Request
    return [f for f in dataclasses.fields(request) if not f.metadata.get("subcommand")]


def test_every_command_but_lm_eval_declares_its_flags_in_a_request():
    assert set(COMMANDS) - set(DECLARED) == {"lm-eval"}  # lm-eval's arguments are lm-eval's, passed through


@pytest.mark.parametrize("command", DECLARED)
def test_each_field_is_one_flag_with_the_fields_help(command):
    fields = {f.name: f for f in _fields(command)}
    seen = set()
    for name, parser in _parsers(command).items():
        actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
        dests = [a.dest for a in actions]
        assert len(dests) == len(set(dests)) and set(dests) <= set(fields), (name, dests)
        for a in actions:
            f = fields[a.dest]
            assert a.help == f.metadata["help"], (name, a.dest)
            assert a.option_strings == ([] if f.metadata.get("positional") else [flag_of(f)]), (name, a.dest)
            assert a.metavar == f.metadata.get("metavar") and a.choices == f.metadata.get("choices"), (name, a.dest)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            assert a.required == required, (name, a.dest)
        seen |= set(dests)
    assert seen == set(fields)  # every field is a flag (of one subcommand at least)


@pytest.mark.parametrize("command", DECLARED)
def test_help_lists_every_field(command, capsys):
    for name in _parsers(command):
        with pytest.raises(SystemExit):
            main([*name.split(), "--help"])
        out = capsys.readouterr().out
        for f in _fields(command):
            if f.metadata.get("only", name.split()[-1]) == name.split()[-1]:
                assert _shown(f) in out, (name, f.name)


def test_no_command_module_adds_a_flag_itself():
    """Only the builder (commands/__init__.py) calls add_argument, and lm-eval for its pass-through words."""
    for path in sorted(COMMANDS_DIR.glob("*.py")):
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", None) == "add_argument"]
        allowed = {"__init__.py": 3, "lm_eval.py": 1}.get(path.name, 0)  # __init__: --version, a positional, an option
        assert len(calls) == allowed, (path.name, len(calls))


def test_numbers_arrive_as_numbers_and_a_bad_one_is_one_line_naming_its_flag(capsys):
    from stateloop.data.stage import Request, resolve_data

    request = Request.of(build_parser().parse_args(["tokenize", "--out", "x", "--model-vocab-size", "12",
                                                    "--set", "data.max_docs=12", "data.val_fraction=0.01"]))
    assert request.model_vocab_size == 12 and type(request.model_vocab_size) is int
    data = resolve_data(request)[0]
    assert data.max_docs == 12 and type(data.max_docs) is int and data.val_fraction == 0.01
    assert run_command(["tokenize", "--out", "x", "--model-vocab-size", "twelve"]) == 2
    assert capsys.readouterr().err == "stateloop tokenize: error: --model-vocab-size: expected an integer, got 'twelve'\n"
    # a setting, as train and eval take it: --set names the key
    assert run_command(["tokenize", "--out", "x", "--set", "data.max_docs=twelve"]) == 2
    assert capsys.readouterr().err == "stateloop tokenize: error: data.max_docs: expected an integer, got 'twelve'\n"


def test_set_is_one_field_everywhere():
    for command in ("train", "eval", "bench", "tokenize"):
        assert [f.name for f in _fields(command) if flag_of(f) == "--set"] == ["overrides"], command
