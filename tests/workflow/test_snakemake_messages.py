"""Snakemake as its users meet it, without running the DAG: the report's landing page names each
experiment's models, and a missing config file or an unknown target ends the call with Snakemake's
own message, the Snakefile adding no traceback (dry runs and placeholder outputs only)."""

import re

import pytest

from stateloop.experiments import load_pipeline
from support.dag import copy_workflow, embedded, snakemake, text_of

pytestmark = pytest.mark.slow


def test_the_reports_landing_page_lists_each_experiments_models(tmp_path):
    """The smoke config's experiments take the paper's models (no `models:` key): the landing page
    lists them as the config resolves them (pipeline.PAPER_MODELS), not an empty "; models"."""
    work = copy_workflow(tmp_path / "wf")
    summary = snakemake(work, "--summary", "--configfile", "configs/smoke.yaml").stdout
    outputs = [line.split("\t")[0] for line in summary.splitlines()[1:]]
    reported = [o for o in outputs if re.fullmatch(r"(results/\w+\.(csv|md)|figures/\w+\.(pdf|png))", o)]
    assert "results/claims.md" in reported and "figures/loop_depth.png" in reported
    for rel in reported:  # placeholders: the report needs its files, not their contents
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("placeholder\n")
    snakemake(work, "--report", "report.html", "--configfile", "configs/smoke.yaml")
    desc = text_of(embedded((work / "report.html").read_text(), "workflow_desc", "workflow-desc"))
    cfg = load_pipeline(work / "configs/smoke.yaml")
    assert all(exp.models for exp in cfg.experiments.values())
    for name, exp in cfg.experiments.items():
        line = re.search(rf"{name}: scale {exp.scale}, [^;]*; models ([a-z0-9_, ]*?)(?= \w+: scale | The scales)", desc)
        assert line, (name, desc)
        assert line.group(1).split(", ") == exp.models, (name, line.group(0))


def test_a_missing_config_file_is_named_and_nothing_is_planned(tmp_path):
    """Snakemake (9.27) reads --configfile in its own command line, before the Snakefile: what it
    prints, a traceback ending in the FileNotFoundError, is its own, and the Snakefile cannot catch
    it. The call fails naming the file, and plans and writes nothing."""
    work = copy_workflow(tmp_path / "wf")
    proc = snakemake(work, "-n", "--configfile", "MISSING.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "No such file or directory: 'MISSING.yaml'" in text, text
    assert "Job stats" not in text and not (work / "results").exists()


def test_an_unknown_target_is_one_line_without_a_traceback(tmp_path):
    """Snakemake's own MissingRuleException, one line; the Snakefile's parse adds no traceback."""
    work = copy_workflow(tmp_path / "wf")
    proc = snakemake(work, "-n", "results/table9.csv", "--configfile", "configs/smoke.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in text and "Job stats" not in text, text
    assert len([line for line in text.splitlines() if "No rule to produce results/table9.csv" in line]) == 1, text
