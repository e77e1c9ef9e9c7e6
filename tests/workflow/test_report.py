"""`snakemake --report report.html` on the smoke DAG (its rehearsal, run once per session): one
self-contained HTML file with every table, figure and the claims, each captioned with its scale,
its seeds and what it compares; and the render rules run on the submitting host under SLURM."""

import base64
import os
import re
import shutil
import subprocess

import pytest

from stateloop.experiments import expand_runs, load_pipeline
from support.dag import ROOT, embedded, text_of
from support.rehearsals import dag

pytestmark = pytest.mark.slow

PATTERNS = ["results/table[1-4].csv", "results/table[1-4].md", "figures/*.pdf", "figures/*.png", "results/claims.*",
            "results/compare_*.csv", "results/compare_*.md"]
EXPERIMENT = {"table1": ["table1"], "table2": ["table1"], "table4": ["table4"],  # output -> the experiments it reads
              "loop_depth": ["loop_depth"], "state_width": ["state_width"], "state_analysis": ["state_analysis"],
              "gap_vs_tokens": ["loop_depth", "table1", "table4"], "state_diagnostics": ["table4", "loop_depth", "table1"],
              "test_time_depth": ["test_time_depth"]}


def runs_read(cfg, stem):
    """The runs an output reads: its experiment's, and for Figure 3 the Vanilla Looped reference
    runs at its K (workflow/rules/common.smk: figure_inputs)."""
    runs = expand_runs(cfg, EXPERIMENT[stem])
    if stem == "state_width":
        ks = {r.K for r in runs}
        runs += [r for r in expand_runs(cfg) if r.model == "vanilla_looped" and r.K in ks and r.id not in {x.id for x in runs}]
    return runs


def seeds_in(caption: str, before: str) -> set[int]:
    """The seed list that follows the pattern ``before`` in a caption's text."""
    m = re.search(before + r"(\d+(?:, \d+)*)", caption)
    assert m, (before, caption)
    return {int(s) for s in m.group(1).split(", ")}


@pytest.fixture(scope="module")
def report(smoke_dag, tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    proc = dag(smoke_dag, "--report", str(path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return path


def test_report_is_one_html_file_with_every_output_and_its_caption(smoke_dag, report):
    html = report.read_text()
    assert html.lstrip().lower().startswith("<!doctype html") or html.lstrip().startswith("<html")
    results = embedded(html, "results", "results")
    outputs = sorted(str(p.relative_to(smoke_dag)) for pat in PATTERNS for p in smoke_dag.glob(pat))
    assert "results/claims.md" in outputs and "results/table1.csv" in outputs and "figures/loop_depth.png" in outputs
    assert sorted(results) == outputs
    for path, entry in results.items():  # the file itself travels inside the HTML (a data URI)
        data = base64.b64decode(entry["data_uri"].split("base64,", 1)[1])
        assert data == (smoke_dag / path).read_bytes(), path
        assert "System Message" not in entry["caption"], (path, entry["caption"])  # docutils' rst errors
    categories = embedded(html, "categories", "categories")
    assert set(categories) == {"Tables", "Figures", "Claims", "Comparisons"} and "Table 4: the ablations" in categories["Tables"]
    assert categories["Comparisons"] == {"Comparison: gru_update": ["results/compare_gru_update.csv", "results/compare_gru_update.md"]}
    assert sorted(p for subcats in categories.values() for paths in subcats.values() for p in paths) == outputs

    cfg = load_pipeline(smoke_dag / "config.yaml")
    for path, entry in results.items():
        caption = text_of(entry["caption"])
        stem = os.path.basename(path).split(".")[0]
        if stem in EXPERIMENT:
            exp = cfg.experiments[EXPERIMENT[stem][0]]
            runs = runs_read(cfg, stem)
            assert f"Scale {exp.scale}:" in caption, (path, caption)
            assert seeds_in(caption, "Seeds: ") == {r.seed for r in runs}, (path, caption)
            count = re.search(r"(\d+) runs? in (\d+) cells?\.", caption)
            assert count and count.groups() == (str(len(runs)), str(len({r.cell for r in runs}))), (path, caption)
        elif stem.startswith("compare_"):  # an experiment's own comparison: its models against its baseline
            name = stem.removeprefix("compare_")
            runs = expand_runs(cfg, [name])
            assert f"Comparison: {name}" in caption and "against its baseline, vanilla_looped" in caption, caption
            assert f"Scale {cfg.experiments[name].scale}:" in caption and seeds_in(caption, "Seeds: ") == {r.seed for r in runs}
            n_cells = len({r.cell for r in runs})
            assert f"{len(runs)} runs in {n_cells} cells." in caption, caption
        elif stem == "table3":
            assert f"Scale {cfg.experiments['decoding'].scale}:" in caption
            assert "Seeds: none (untrained shapes)" in caption and f"{cfg.bench.repeats} timed runs" in caption
        else:  # the claims: each experiment with its scale and seeds
            assert stem == "claims"
            for name, exp in cfg.experiments.items():
                assert re.search(rf"{name}: scale {exp.scale} \(", caption), (name, caption)
                if exp.trained:
                    assert seeds_in(caption, rf"{name}: scale {exp.scale} \(.*?\); seeds ") == {
                        r.seed for r in expand_runs(cfg, [name])}, (name, caption)
                else:
                    assert re.search(rf"{name}: scale {exp.scale} \(.*?\); seeds none \(untrained shapes\)", caption)
    # what each compares, in words
    caps = {os.path.basename(p): text_of(e["caption"]) for p, e in results.items()}
    assert "against Vanilla Looped" in caps["table1.csv"] and "each against StateLoop" in caps["table4.md"]
    assert "loop depth K" in caps["loop_depth.png"] and "verdict" in caps["claims.md"]

    desc = text_of(embedded(html, "workflow_desc", "workflow-desc"))
    assert "StateLoop reproduction" in desc and all(name in desc for name in cfg.experiments)


FAKE_SLURM = """#!/bin/sh
# stand-in for SLURM's {name} (tests/workflow/test_report.py): records the call, submits nothing
{{ printf '{name}'; for a in "$@"; do printf ' %s' "$a"; done; printf '\\n'; }} >> "{log}"
if [ "{name}" = sinfo ]; then printf 'PARTITION\\ndebug*\\n'; exit 0; fi  # one default partition
echo "{name}: no cluster here (test stand-in)" >&2
exit 1
"""


def rule_lines(text: str) -> list[str]:
    return re.findall(r"^((?:local)?rule \w+):", text, re.M)


def test_render_rules_run_locally_and_training_is_submitted_under_slurm(smoke_dag, tmp_path):
    """Snakemake 9.27 prints no local/remote decision in a dry run ("localrule" appears only when
    jobs run), so this runs `--profile slurm` for real in a copy of the smoke DAG, with stand-ins
    for SLURM's commands that record each call and submit nothing: the renders run here, and a
    training goes to sbatch."""
    from stateloop.ops.rehearse.run import environment, snakemake_command

    work = tmp_path / "dag"
    shutil.copytree(smoke_dag, work, symlinks=True, ignore=shutil.ignore_patterns("locks"))
    fake = tmp_path / "slurm"
    fake.mkdir()
    log = tmp_path / "slurm.log"
    for name in ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "sacctmgr", "sshare", "scancel", "srun"):
        (fake / name).write_text(FAKE_SLURM.format(name=name, log=log))
        (fake / name).chmod(0o755)
    e = environment(work)
    e["PATH"] = f"{fake}{os.pathsep}{e['PATH']}"

    def run(*args):
        # Profile paths and the profile's configfile resolve from the checkout; --configfile
        # (the rehearsal's) replaces the profile's.
        return subprocess.run(snakemake_command(work, 1, [*args, "--profile", str(ROOT / "profiles/slurm"), "--retries", "0"]),
                              cwd=ROOT, env=e, capture_output=True, text=True, timeout=600)

    renders = ["results/table3.csv", "figures/loop_depth.png", "results/claims.md"]
    before = {t: (work / t).stat().st_mtime_ns for t in renders}
    proc = run(*renders, "--forcerun", "render_table", "render_figure", "render_claims",
               "--allowed-rules", "render_table", "render_figure", "render_claims")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert sorted(rule_lines(out)) == ["localrule render_claims", "localrule render_figure", "localrule render_table"], out[-6000:]
    assert all((work / t).stat().st_mtime_ns > before[t] for t in renders)  # rendered again, here
    assert not log.exists() or "sbatch" not in log.read_text()

    cfg = load_pipeline(work / "config.yaml")
    run_ = expand_runs(cfg, ["table4"])[0]
    proc = run(f"{run_.folder}/model.safetensors", "--forcerun", "train", "--allowed-rules", "train",
               "--slurm-init-seconds-before-status-checks", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0  # the stand-in refuses the submission
    assert "rule train" in rule_lines(out) and "localrule train" not in rule_lines(out), out[-6000:]
    submitted = [line for line in log.read_text().splitlines() if line.startswith("sbatch ")]
    assert submitted and all("--comment rule_train_wildcards_" in line for line in submitted), submitted
