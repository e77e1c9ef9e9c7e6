"""The files the field's tools read at a repository's top level: LICENSE, CITATION.cff (GitHub's
"Cite this repository") and .snakemake-workflow-catalog.yml (the Snakemake workflow catalog)."""

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT.parent / "shared/paper/stateloop-paper.txt"


def test_license_and_citation_agree_with_the_package():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n") and cff["license"] == "MIT"
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert cff["version"] == project["version"]
    assert {"message", "title", "authors", "preferred-citation"} <= set(cff)
    paper = cff["preferred-citation"]
    assert paper["type"] == "article" and paper["year"] == 2026
    assert paper["title"] in project["description"] and paper["title"] in cff["title"]


def test_the_preferred_citation_is_the_papers_title_and_authors():
    """The paper's first lines: its title, then its authors, in order."""
    if not PAPER.is_file():
        pytest.skip(f"{PAPER} not found: the paper's text sits beside the checkout only in the project's workspace")
    lines = [line.strip() for line in PAPER.read_text().splitlines() if line.strip()]
    title = next(line for line in lines if line.startswith("StateLoop:"))
    authors = lines[lines.index(title) + 1].split(", ")
    paper = yaml.safe_load((ROOT / "CITATION.cff").read_text())["preferred-citation"]
    assert paper["title"] == title
    assert [f"{a['given-names']} {a['family-names']}" for a in paper["authors"]] == authors
    assert re.search(r"Published \w+ \d+, 2026", PAPER.read_text()) and paper["month"] == 10  # "Published Oct 26, 2026"


def test_workflow_catalog_file_says_what_the_workflow_supports():
    """The catalog's keys only; `conda: true` holds for every rule that runs a command (each names
    envs/stateloop.yaml), and `report: true` for a workflow with a --report (its captions)."""
    usage = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"}
    assert "configs/README.md" in usage["mandatory-flags"]["desc"] and (ROOT / "configs/README.md").is_file()
    deploy = usage["software-stack-deployment"]
    assert set(deploy) <= {"conda", "apptainer", "apptainer+conda", "singularity", "singularity+conda"}
    assert deploy["conda"] is True and (ROOT / "envs/stateloop.yaml").is_file()
    rules = re.split(r"\n(?=rule \w+:)", "\n".join(p.read_text() for p in sorted((ROOT / "workflow/rules").glob("*.smk"))))
    commands = [r for r in rules if r.startswith("rule ") and "\n    shell:" in r]
    assert len(commands) >= 10
    for rule in commands:
        assert '\n    conda:\n        "../../envs/stateloop.yaml"' in rule, rule.splitlines()[0]
    assert usage["report"] is True and list((ROOT / "workflow/report").glob("*.rst"))
