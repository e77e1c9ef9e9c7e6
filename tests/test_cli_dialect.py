"""The command line speaks one dialect: one spelling for the output path and
for quiet runs across every command, unknown names refused, `none` read as unset."""

import argparse
import os
from pathlib import Path

import pytest

from stateloop.commands import build_parser


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
              "schema", "rehearse", "export"}
    assert {c for c, o in options.items() if "--out" in o} == writes
    assert {c for c, o in options.items() if "--no-progress" in o} == {"eval", "analyze shapley", "analyze interventions",
                                                                      "bench decode", "tokenize", "train"}


def test_an_unknown_state_update_is_refused():
    from stateloop.config.model import ModelConfig
    from stateloop.models.looped import StateLoopLM

    cfg = ModelConfig(vocab_size=32, n_layers=1, d_model=16, d_ff=32, n_heads=2, head_dim=8, max_seq_len=16, K=2, d_s=8)
    with pytest.raises(ValueError, match=r"unknown state update 'gur' \(known: ssm, gru\)"):
        StateLoopLM(cfg, update="gur")
    assert type(StateLoopLM(cfg, update="gru").cell).__name__ == "GRUStateCell"


@pytest.mark.parametrize("spelling", ["none", "None", "null"])
def test_none_on_the_command_line_unsets_a_number(spelling):
    from stateloop.data.stage import Request
    from stateloop.data.stage import resolve_data as resolve

    args = build_parser().parse_args(["tokenize", "--out", "x", "--model-vocab-size", spelling])
    assert Request.of(args).model_vocab_size is None
    args = build_parser().parse_args(["tokenize", "--out", "x", "--model-vocab-size", "12"])
    assert Request.of(args).model_vocab_size == 12
    # a setting given with --set is YAML: null (not "none") unsets it
    args = build_parser().parse_args(["tokenize", "--out", "x", "--set", "data.max_docs=12"])
    assert resolve(Request.of(args))[0].max_docs == 12
    args = build_parser().parse_args(["tokenize", "--out", "x", "--set", "data.max_docs=null"])
    assert resolve(Request.of(args))[0].max_docs is None


def test_building_the_parser_imports_no_heavy_library():
    """`stateloop --help` and every command's parser start without torch, lightning or mlflow
    (stateloop/commands/__init__.py: command modules import them inside run)."""
    import subprocess
    import sys

    code = ("import sys, stateloop.cli, stateloop.commands; stateloop.commands.build_parser(); "
            "print(sorted(m for m in ('torch', 'lightning_fabric', 'mlflow', 'lm_eval') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


# One RUN in every command that addresses runs: a run folder or a run id (runs.py: resolve_run_arg).
RID = "s/stateloop/K2_ds16_seed7"
RUN_COMMANDS = {  # command -> argv with {run} where the RUN goes
    "train": ["train", "--config", "cfg.yaml", "{run}", "--data-dir", "data", "--set", "train.lr=1e-3"],
    "eval": ["eval", "{run}", "--no-mlflow", "--no-progress"],
    "analyze shapley": ["analyze", "shapley", "{run}", "--no-mlflow", "--no-progress"],
    "analyze interventions": ["analyze", "interventions", "{run}", "--no-mlflow", "--no-progress"],
    "bench decode": ["bench", "decode", "--runs", "{run}", "--device", "cpu", "--no-progress", "--out", "b.json"],
    "export": ["export", "{run}", "--out", "hf"],
}


def _actions(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, list[argparse.Action]]:
    """command (and subcommand) -> its actions, every parser the CLI builds."""
    out = {prefix.strip(): list(parser._actions)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_actions(sub, f"{prefix} {name}"))
    return out


def test_runs_are_addressed_one_way_and_no_command_has_a_run_option():
    """`RUN` (a run folder or a run id) in train, eval, analyze and bench decode; never `--run`,
    `--run-dir(s)` or a RUN_DIR that takes only folders."""
    actions = _actions(build_parser())
    for command, acts in actions.items():
        for a in acts:
            assert not {s for s in a.option_strings if s.startswith("--run") and s != "--runs"}, (command, a.option_strings)
            assert a.metavar != "RUN_DIR" and a.dest not in ("run_dir", "run_dirs"), (command, a.dest, a.metavar)
    takes_run = {c for c, acts in actions.items() if any(a.metavar == "RUN" for a in acts)}
    assert takes_run == set(RUN_COMMANDS)
    assert [a for a in actions["bench decode"] if a.metavar == "RUN"][0].option_strings == ["--runs"]


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    """In tmp_path with results/runs/RID made: what folder (and, for train, run id, overrides and
    output folder) each command would read, recorded where it would start reading weights or training."""
    from stateloop import runs
    from stateloop.config import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results/runs" / RID).mkdir(parents=True)
    seen = []

    def read_weights(run_dir, tensors=True):
        seen.append({"folder": Path(run_dir).resolve()})
        raise ConfigError("recorded")

    def resolve_run(config_path, run_id, overrides=None, data_dir=None):
        seen.append({"id": run_id, "overrides": list(overrides or [])})
        return RunConfig(RunSection(run_id), ModelConfig(), TrainConfig(), DataSection())

    def train(config, out, progress=True, restart=False):
        seen[-1]["folder"] = Path(out).resolve()
        raise ConfigError("recorded")

    import stateloop.resolve
    import stateloop.train.loop
    import stateloop.train.slurm
    from stateloop.config.model import ModelConfig
    from stateloop.config.run import DataSection, RunConfig, RunSection
    from stateloop.config.train import TrainConfig

    monkeypatch.setattr(runs, "read_weights", read_weights)
    monkeypatch.setattr(stateloop.resolve, "resolve_run", resolve_run)
    monkeypatch.setattr(stateloop.train.slurm, "warn_cpu_fallback", lambda accelerator: None)
    monkeypatch.setattr(stateloop.train.loop, "train", train)
    monkeypatch.setattr("stateloop.commands.train.gate_run", lambda config, run: None)  # reads the config file
    monkeypatch.setattr("stateloop.commands.train.check_cluster_file", lambda config: None)  # reads it too
    return seen


def _argv(command: str, run: str, *extra: str) -> list[str]:
    return [run if a == "{run}" else a for a in RUN_COMMANDS[command]] + list(extra)


@pytest.mark.parametrize("command", list(RUN_COMMANDS))
def test_a_run_id_and_its_run_folder_address_the_same_run(command, recorded, tmp_path, capsys):
    from stateloop.cli import main

    folder = (tmp_path / "results/runs" / RID).resolve()
    for run in (RID, str(folder), "results/runs/" + RID + "/"):
        assert main(_argv(command, run)) == 2 and "recorded" in capsys.readouterr().err
    assert [r["folder"] for r in recorded] == [folder] * 3
    if command == "train":  # the run id the folder spells is the one trained; overrides after options still count
        assert {r["id"] for r in recorded} == {RID} and {tuple(r["overrides"]) for r in recorded} == {("train.lr=1e-3",)}
        assert main(_argv(command, str(folder), "--out", "elsewhere")) == 2
        assert recorded[-1]["folder"] == (tmp_path / "elsewhere").resolve()


@pytest.mark.parametrize("command", list(RUN_COMMANDS))
def test_a_malformed_run_is_one_line_naming_it_and_both_forms(command, recorded, capsys):
    from stateloop.cli import main

    for bad in ("tiny/stateloop/K3_ds64", "no/such/folder"):
        assert main(_argv(command, bad)) == 2
        err = capsys.readouterr().err.strip()
        name = "--runs" if command == "bench decode" else "RUN"
        assert len(err.splitlines()) == 1 and err.startswith(f"stateloop {command.split()[0]}: error: {name}: "), err
        assert repr(bad) in err and "run folder" in err and "{scale}/{model}/K{K}_ds{ds}_seed{seed}" in err, err
    assert recorded == []  # refused before anything is read


@pytest.mark.parametrize("command", list(RUN_COMMANDS))
def test_a_run_id_that_climbs_out_of_the_runs_folder_is_refused_by_every_command(command, recorded, tmp_path, monkeypatch,
                                                                                capsys):
    """`stateloop export ../stateloop/K3_ds32_seed1234 --out x` (and `eval` of it) read a folder
    outside results/runs and exited 0, while `train` refused that run id. No config has a scale
    '.' or '..', so every command refuses such a RUN in the same one line, whether results/runs/<RUN>
    or a folder at the path RUN exists; the line says how to give a folder by its path."""
    from stateloop.cli import main

    for scale in ("..", "."):
        bad = f"{scale}/stateloop/K2_ds16_seed7"
        (tmp_path / "results/runs" / bad).mkdir(parents=True, exist_ok=True)  # as a run id: results/runs/<bad>
        (tmp_path / "work" / bad).mkdir(parents=True, exist_ok=True)  # and, from work/, a folder at the path <bad>
        for cwd in (tmp_path, tmp_path / "work"):
            monkeypatch.chdir(cwd)
            assert main(_argv(command, bad)) == 2
            err = capsys.readouterr().err.strip()
            name = "--runs" if command == "bench decode" else "RUN"
            assert len(err.splitlines()) == 1, err
            assert err == (f"stateloop {command.split()[0]}: error: {name}: {bad!r}: {scale!r} is not a scale (a run id "
                           f"names a folder inside results/runs); give a run folder elsewhere by its full path, e.g. "
                           f"{os.path.abspath(bad)}"), err
    assert recorded == []  # refused before anything is read


@pytest.mark.parametrize("command", [c for c in RUN_COMMANDS if c != "train"])
def test_a_run_id_without_its_folder_is_the_missing_run_folder_error(command, tmp_path, monkeypatch, capsys):
    from stateloop.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(_argv(command, "s/stateloop/K2_ds16_seed8")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "results/runs/s/stateloop/K2_ds16_seed8/model.safetensors: no final weights (no such run folder)" in err, err


def test_train_takes_only_a_folder_that_spells_its_run_id(recorded, tmp_path, capsys):
    from stateloop.cli import main

    (tmp_path / "elsewhere").mkdir()
    assert main(_argv("train", str(tmp_path / "elsewhere"))) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "RUN: " in err and "/runs/{scale}/{model}/K{K}_ds{ds}_seed{seed}" in err, err
    assert recorded == []


@pytest.mark.parametrize("cores", ["0", "-3"])
def test_rehearse_refuses_fewer_than_one_core(cores, capsys):
    """`stateloop rehearse C --cores 0` hung (Snakemake waits for a core that never comes) and
    `--cores -3` was taken without a word: both are refused by the parser, in one line."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["rehearse", "configs/tiny.yaml", "--cores", cores])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"stateloop rehearse: error: argument --cores: must be a whole number of cores >= 1, got {cores}", err


@pytest.mark.parametrize("order", ["config-first", "out-first"])
def test_rehearse_takes_its_options_before_or_after_the_config(order, tmp_path, monkeypatch, capsys):
    """`stateloop rehearse CONFIG --out DIR -- ARGS` failed ("unrecognized arguments") where `--out
    DIR CONFIG -- ARGS` worked: every word after the first `--` goes to Snakemake, whatever the order
    before it."""
    import stateloop.ops.rehearse.run as rehearsal
    from stateloop.commands import run_command

    seen = []
    monkeypatch.setattr(rehearsal, "prepare", lambda config, out, shared: seen.append(("prepare", config, out, shared))
                        or Path(out) / "config.yaml")
    monkeypatch.setattr(rehearsal, "run_dag", lambda out, cores, extra: seen.append(("run", out, cores, extra))
                        or argparse.Namespace(returncode=0))
    out = str(tmp_path / "r")
    words = ["configs/tiny.yaml", "--out", out] if order == "config-first" else ["--out", out, "configs/tiny.yaml"]
    assert run_command(["rehearse", *words, "--cores", "1", "--", "-n", "--forceall", "results/table4.csv"]) == 0
    assert seen == [("prepare", "configs/tiny.yaml", Path(out), None), ("run", Path(out), 1, ["-n", "--forceall", "results/table4.csv"])]


@pytest.mark.parametrize("threads", ["0", "-2", "two"])
def test_bench_decode_refuses_fewer_than_one_thread(threads, capsys):
    """`stateloop bench decode --threads 0` was ignored without a word and a negative count ended in
    torch's traceback: both are refused by the parser, in one line."""
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["bench", "decode", "--threads", threads])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"stateloop bench decode: error: argument --threads: must be a whole number of threads >= 1, got {threads}", err
