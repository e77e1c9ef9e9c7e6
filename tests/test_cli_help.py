"""`stateloop --version` and `stateloop --help` as a new user reads them: the version of the
installed package, and the commands in the order the DAG runs them (read from Snakemake's own
rule graph), the tools after them."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stateloop.cli import main
from stateloop.commands import PIPELINE, TOOLS
from support.dag import ROOT, copy_workflow, snakemake


def _run(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_version_is_the_packages(capsys):
    """The version pyproject.toml declares, as the installed metadata carries it."""
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    assert _run(capsys, "--version").strip() == f"stateloop {declared}"


def _listed(help_text: str) -> list[str]:
    """The commands `--help` lists, in its order (the indented `name  help` lines)."""
    return re.findall(r"^    ([a-z][a-z-]*)(?:\s{2,}|\n)", help_text, flags=re.M)


def _rule_commands() -> dict[str, str]:
    """rule -> the `stateloop` command its shell runs (workflow/rules/*.smk)."""
    out = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            name = block.split(":", 1)[0]
            found = re.search(r"stateloop ([a-z][a-z-]*)", block)
            if found:
                out[name] = found.group(1)
    return out


@pytest.mark.slow
def test_help_lists_the_pipeline_in_the_dags_order_then_the_tools(capsys, tmp_path):
    listed = _listed(_run(capsys, "--help"))
    assert listed == list(PIPELINE) + list(TOOLS)
    # The DAG's own rule graph (every target, the exports too): each edge's commands in order.
    wf = copy_workflow(tmp_path / "wf")
    dot = snakemake(wf, "all", "exports", "--rulegraph", "--configfile", "configs/smoke.yaml").stdout
    names = dict(re.findall(r"^\s*(\d+)\[label = \"(\w+)\"", dot, flags=re.M))
    commands = _rule_commands()
    ran = {commands[r] for r in names.values() if r in commands}
    assert ran == set(PIPELINE), ran  # every stage a rule runs, and no tool, is a pipeline command
    edges = [(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dot, flags=re.M)]
    checked = 0
    for a, b in edges:
        if a in commands and b in commands and commands[a] != commands[b]:
            assert listed.index(commands[a]) < listed.index(commands[b]), (a, b)
            checked += 1
    assert checked >= 6  # tokenize -> train -> eval -> render, train -> analyze, bench -> render, train -> export


def test_the_installed_command_prints_the_version():
    out = subprocess.run([sys.executable, "-m", "stateloop.cli", "--version"], capture_output=True, text=True,
                         check=True, cwd=Path(ROOT)).stdout
    assert re.fullmatch(r"stateloop \d+\.\d+\.\d+\S*\n", out), out
