"""Rerun triggers: a job reruns when what it reads changes, and only then. The smoke
DAG's outputs are placeholders, marked done with `snakemake --touch --forceall` (which records
every job's params as a run would); each config change is then planned by a dry run, whose jobs
are the ones the change reruns. No job runs."""

import pytest
import yaml

from support.dag import copy_workflow, jobs, snakemake

pytestmark = pytest.mark.slow
BASE = ("--configfile", "configs/smoke.yaml")


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("triggers"))
    summary = snakemake(work, "--summary", *BASE).stdout
    for rel in (line.split("\t")[0] for line in summary.splitlines()[1:]):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("placeholder\n")
    snakemake(work, "--touch", "--forceall", "--cores", "1", *BASE)
    assert "Nothing to be done" in snakemake(work, "-n", *BASE).stdout
    return work


def _rerun(work, change: dict) -> set[str]:
    """The jobs a change of the config plans: rule, or rule:first output for the renders."""
    (work / "change.yaml").write_text(yaml.safe_dump(change))
    planned = jobs(snakemake(work, "-n", *BASE, "change.yaml").stdout)
    return {j["rule"] if not j["rule"].startswith("render") else f"{j['rule']}:{j['output'].split(',')[0]}"
            for j in planned if j["rule"] != "all"}


RENDERS_OF_SMOKE = {"render_table:results/table1.csv", "render_table:results/table2.csv", "render_table:results/table4.csv",
                    "render_figure:figures/loop_depth.pdf", "render_figure:figures/state_width.pdf",
                    "render_figure:figures/state_analysis.pdf", "render_figure:figures/gap_vs_tokens.pdf",
                    "render_figure:figures/state_diagnostics.pdf", "render_claims:results/claims.md"}


def test_bootstrap_iters_reruns_the_evaluations_not_the_analyses(done):
    """eval.bootstrap_iters sets lm-eval's standard errors: the Shapley values (2^K passes) and
    the interventions do not read it."""
    rerun = _rerun(done, {"scales": {"smoke": {"eval": {"bootstrap_iters": 7}}}})
    assert "eval" in rerun and not {"shapley", "interventions", "train", "tokenize"} & rerun, rerun


def test_the_held_out_set_reruns_the_analyses_too(done):
    rerun = _rerun(done, {"scales": {"smoke": {"eval": {"heldout_windows": 8}}}})
    assert {"eval", "shapley", "interventions"} <= rerun and not {"train", "tokenize"} & rerun, rerun


def test_the_benchmark_settings_rerun_table3_and_the_claims_only(done):
    rerun = _rerun(done, {"bench": {"repeats": 3}})
    assert rerun == {"bench_decode", "render_table:results/table3.csv", "render_claims:results/claims.md"}, rerun


def test_a_setting_only_the_report_reads_reruns_the_renders_of_its_scale(done):
    """`paper: true` on the smoke scale: every output of that scale again, not Table 3 (the decode
    scale's), and no training or evaluation."""
    assert _rerun(done, {"scales": {"smoke": {"paper": True}}}) == RENDERS_OF_SMOKE


def test_resources_rerun_nothing(done):
    assert _rerun(done, {"scales": {"smoke": {"resources": {"eval": {"runtime": 31}}},
                                    "decode": {"resources": {"bench": {"runtime": 31}}}}}) == set()


def test_an_experiments_seeds_rerun_the_outputs_that_read_it(done):
    """A seed more for Figure 3: its new run (train, eval), Figure 3 and the claims; not Figure 2."""
    rerun = _rerun(done, {"experiments": {"state_width": {"seeds": [1234, 7]}}})
    renders = {j for j in rerun if j.startswith("render")}
    assert renders == {"render_figure:figures/state_width.pdf", "render_claims:results/claims.md"}, rerun
    assert {"train", "eval"} <= rerun


@pytest.mark.parametrize("change, first", [
    ({"scales": {"smoke": {"data": {"synthetic": {"train_docs": 500}}}}}, "tokenize"),
    ({"scales": {"smoke": {"train": {"lr": 1.0e-3}}}}, "train"),
])
def test_data_and_training_rerun_their_scale_from_that_stage_on(done, change, first):
    """The smoke scale's data or training: its stages from there on and every output of the scale;
    the untrained decode scale's timings and Table 3 stay."""
    rerun = _rerun(done, change)
    stages = {"tokenize", "train", "eval", "shapley", "interventions"}
    assert {j for j in rerun if j in stages} == (stages if first == "tokenize" else stages - {"tokenize"}), rerun
    assert {j for j in rerun if j.startswith("render")} == RENDERS_OF_SMOKE and "bench_decode" not in rerun


def test_the_decode_scales_model_reruns_its_timings_table3_and_the_claims(done):
    rerun = _rerun(done, {"scales": {"decode": {"model": {"d_ff": 352}}}})
    assert rerun == {"bench_decode", "render_table:results/table3.csv", "render_claims:results/claims.md"}, rerun
