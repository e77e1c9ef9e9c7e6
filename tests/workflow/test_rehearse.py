"""Rehearsals: every config in configs/ runs its own DAG end to end offline on this CPU, with what
the user's run exercises kept and only sizes shrunk (``stateloop rehearse``, stateloop/ops/rehearse/).

The folder is enumerated, so a config added to configs/ is rehearsed too. Each rehearsal runs
once per session (a fixture); the tests then read its outputs and records."""

import json
import os
import signal
import subprocess
import time

import pandas as pd
import pytest
import yaml

from stateloop.config import load_yaml
from stateloop.config.evaluate import PAPER_TASKS
from stateloop.experiments import expand_runs, load_pipeline, pipeline_from_dict
from stateloop.ops.rehearse.config import SEEDS, kept_settings
from stateloop.report.ladder import RUNGS
from support.dag import ROOT
from support.rehearsals import SHARED, dag, needs_shared_data, rehearsed

pytestmark = pytest.mark.slow

# Configs whose rehearsal would repeat another's (CI's 20 minutes), with the reason. Any other
# config added to configs/ is rehearsed.
NOT_REHEARSED = {
    "smoke.yaml": "the tiny rehearsal runs the same DAG at smoke's sizes (d = 32, 4 steps)",
    "decide.yaml": ("trained for real (docs/results.md, 'Deciding the claims'; 60 runs); its DAG is planned in "
                    "test_dag and its code paths run in the tiny rehearsal"),
    "ladder_gpu.yaml": ("ladder.yaml's DAG (rehearsed here) on gpu.yaml's data and tokenizer (gpu.yaml's reasons); "
                        "`stateloop rehearse configs/ladder_gpu.yaml` rehearses it whole, 1.6 min alone, 2.4 in "
                        "CI beside the rehearsals, which took CI to 19.2 minutes (2026-12-04)"),
    "gpu.yaml": ("the paper rehearsal runs the same stages on hub-layout data with the paper's lm-eval tasks; "
                 "its FineWeb-Edu mirror is tested in tests/rehearse/test_mirrors.py, its DAG planned and its "
                 "analyses run in tests/analysis/test_config_splits.py (`stateloop rehearse configs/gpu.yaml` "
                 "rehearses it whole, ~5 min): CI's 20 minutes"),
}
# A config with this experiment is a compute ladder (report/ladder.py): its outputs are the gap
# against compute and the claims, not the paper's tables.
LADDER = RUNGS[0]
LADDER_OUTPUTS = ["figures/gap_vs_compute.pdf", "figures/gap_vs_compute.png", "results/claims.md", "results/claims.csv"]
# The interrupted rehearsal's training: long enough that the DAG is killed mid-run after its first
# checkpoint (step 2), short enough that the resumed run costs seconds, not minutes.
STEPS = 16
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if p.name not in NOT_REHEARSED)
OUTPUTS = [f"results/table{i}.{ext}" for i in (1, 2, 3, 4) for ext in ("csv", "md")] + [
    f"figures/{f}.{ext}" for f in ("loop_depth", "state_width", "state_analysis", "gap_vs_tokens", "state_diagnostics")
    for ext in ("pdf", "png")] + [
    "results/claims.md", "results/claims.csv"]


@pytest.fixture(scope="session", params=CONFIGS)
def rehearsal(request, tmp_path_factory):
    """(config name, its raw mapping, the rehearsal folder) after the whole DAG ran."""
    name = request.param
    raw = load_yaml(ROOT / "configs" / name)
    if needs_shared_data(raw) and not SHARED.is_dir():
        pytest.skip(f"{SHARED} not found: rehearsing {name} needs the local data copies beside the checkout")
    return name, raw, rehearsed(name, tmp_path_factory)


def _skip_ladder(raw: dict) -> None:
    if LADDER in raw["experiments"]:
        pytest.skip("a compute ladder has no paper tables (test_a_ladders_rehearsal_fits_its_gap_against_compute)")


def test_a_ladders_rehearsal_fits_its_gap_against_compute(rehearsal):
    """A ladder's figure and its claims rows, one per K, fitted over every rung and seed (the
    rehearsal keeps the rungs' order of compute and two seeds)."""
    name, raw, out = rehearsal
    if LADDER not in raw["experiments"]:
        pytest.skip("not a compute ladder")
    for rel in LADDER_OUTPUTS:
        assert (out / rel).is_file() and (out / rel).stat().st_size > 0, (name, rel)
    claims = pd.read_csv(out / "results/claims.csv").set_index("id")
    rows = claims[claims.source.str.startswith("own: compute ladder")]
    assert sorted(rows.index) == ["ladder_gap_vs_compute_K4", "ladder_gap_vs_compute_K7"]
    assert (rows.n == 3 * SEEDS).all() and rows.ci_lo.notna().all()
    assert set(rows.verdict) <= {"shrinks", "grows", "holds (no trend resolved)"}


def test_rehearsal_produces_every_table_and_figure_with_the_papers_rows_and_columns(rehearsal):
    name, raw, out = rehearsal
    _skip_ladder(raw)
    for rel in OUTPUTS:
        assert (out / rel).is_file() and (out / rel).stat().st_size > 0, (name, rel)
    cfg = pipeline_from_dict(raw, name)
    t1 = pd.read_csv(out / "results/table1.csv")
    assert list(t1.model) == [r.model for r in expand_runs(cfg, ["table1"])]
    assert t1.pile_ppl.notna().all() and t1.layer_apps_per_token.notna().all()
    t2 = pd.read_csv(out / "results/table2.csv")
    assert (t2.model == "chance").sum() == len(set(t2.shots))  # the chance row of each shot count
    t2 = t2[t2.model != "chance"]
    table1_eval = cfg.scales[cfg.experiments["table1"].scale].eval
    assert set(t2.shots) == set(table1_eval.shots)
    accuracy_tasks = [t for t in PAPER_TASKS if t != "wikitext"]
    if set(PAPER_TASKS) <= set(table1_eval.tasks):  # the paper's tasks: all eight columns and Avg-8
        assert t2[accuracy_tasks + ["avg8"]].notna().all().all()
        for col in ("lambada_openai_ppl", "wikitext2_word_ppl"):
            assert t1[col].notna().all(), col
    t3 = pd.read_csv(out / "results/table3.csv")
    shapes = expand_runs(cfg, ["decoding"])
    assert sorted(zip(t3.model, t3.K)) == sorted((r.model, r.K) for r in shapes)
    t4 = pd.read_csv(out / "results/table4.csv")
    assert list(t4.variant) == ["state_only", "stateloop", "reset_state", "stateloop", "vanilla_looped",
                                "stateloop_gru", "stateloop"]
    # seeds: a rehearsal keeps two of an experiment's seeds; the tables and claims aggregate them
    seeds = min(len(cfg.experiments["table4"].seeds) or 1, SEEDS)
    assert (t4.seeds == seeds).all()
    assert t4.pile_ppl_lo.notna().all() == (seeds > 1)
    claims = pd.read_csv(out / "results/claims.csv").set_index("id")
    ours = claims.source.str.startswith("own: training tokens")  # the project's own trends over training tokens
    assert set(claims[~ours].verdict) <= {"reproduced", "contradicted", "inconclusive", "not run", "-"}
    # every run validates twice (rehearse/config.py's cadence): a slope per seed, a verdict per comparison
    assert ours.any() and set(claims[ours].verdict) <= {"shrinks", "grows", "holds (no trend resolved)"}
    assert (claims.loc["state_only_worse"].n == seeds) and claims.loc["state_branch_cheaper_than_iteration"].n >= 2


def test_the_tiny_dags_own_experiment_renders_its_comparison(smoke_dag):
    """tiny.yaml's gru_update, an experiment of its own (2 models x 3 seeds over Table 4's runs; the
    rehearsal keeps two seeds), renders results/compare_gru_update.csv and .md in the DAG: each
    model's held-out PPL per seed as its eval.json holds it, and the GRU's change against Vanilla
    Looped, paired by seed, with the interval and verdict of Table 1's claims."""
    from stateloop.report import stats
    from stateloop.report.compare import VERDICTS

    spec = load_yaml(ROOT / "configs" / "tiny.yaml")["experiments"]["gru_update"]
    assert len(spec["models"]) == 2 and len(spec["seeds"]) == 3 and "baseline" not in spec
    cfg = load_pipeline(smoke_dag / "config.yaml")
    runs = expand_runs(cfg, ["gru_update"])
    assert {r.id for r in runs} <= {r.id for r in expand_runs(cfg, ["table4"])}  # no training of its own
    seeds = sorted({r.seed for r in runs})
    assert len(seeds) == SEEDS
    df = pd.read_csv(smoke_dag / "results/compare_gru_update.csv")
    assert list(df.model) == ["vanilla_looped", "stateloop_gru"] and list(df.verdict)[0] == "baseline"
    ppl = {(r.model, r.seed): json.loads((smoke_dag / r.folder / "eval.json").read_text())["heldout"]["ppl"] for r in runs}
    for _, row in df.iterrows():
        assert [row[f"ppl_seed{s}"] for s in seeds] == pytest.approx([ppl[(row.model, s)] for s in seeds], abs=1e-4)
    gru = df.iloc[1]
    est = stats.paired({s: ppl[("stateloop_gru", s)] for s in seeds}, {s: ppl[("vanilla_looped", s)] for s in seeds},
                       stats.relative_pct)
    assert (gru.effect_pct, gru.ci_lo, gru.ci_hi) == pytest.approx((est.mean, est.lo, est.hi), abs=1e-4)
    assert gru.n == SEEDS and gru.verdict == VERDICTS[stats.verdict(est, -1)]
    md = (smoke_dag / "results/compare_gru_update.md").read_text()
    assert md.startswith("# Comparison: gru_update") and "each against **vanilla_looped**" in md
    assert f"**{gru.verdict}**" in md


def test_rehearsal_kept_the_configs_training_settings(rehearsal):
    """Precision, strategy (FSDP runs as FSDP, on CPU ranks over gloo), world shape and accumulation
    as recorded by every trained run."""
    name, raw, out = rehearsal
    kept = kept_settings(raw)
    runs = sorted((out / "results/runs").glob("*/*/*/train.json"))
    assert len(runs) == len(expand_runs(load_pipeline(out / "config.yaml")))  # the rehearsal's runs (two seeds at most)
    for path in runs:
        summary = json.loads(path.read_text())
        want = kept[summary["run"].split("/")[0]]
        precision = want["precision"]
        if precision == "auto":  # what auto means on the config's own accelerator
            gpu = raw["scales"][summary["run"].split("/")[0]]["train"].get("accelerator") in ("cuda", "gpu")
            precision = "bf16-mixed" if gpu else "32-true"
        assert summary["precision"] == precision, path
        assert summary["accumulation"] == want["accumulation"], path
        assert (summary["num_nodes"] > 1) == want["multi_node"], path
        assert (summary["world_size"] > 1) == want["multi_device"], path
        if want["multi_node"]:  # started by (the stand-in) srun: Fabric read SLURM's variables
            assert summary["cluster_environment"] == "SLURMEnvironment", path
        if want["multi_device"]:
            assert summary["strategy"] == {"ddp": "DDPStrategy", "fsdp": "ModelParallelStrategy"}[want["strategy"]], path


def test_rehearsal_evaluated_the_configs_tasks_by_their_names_and_its_table3_dtype(rehearsal):
    name, raw, out = rehearsal
    _skip_ladder(raw)
    cfg = pipeline_from_dict(load_yaml(out / "config.yaml"), name)  # the rehearsal's run ids (d_s shrinks)
    for run in expand_runs(cfg, ["table1"]):
        ev = json.loads((out / "results/runs" / run.id / "eval.json").read_text())
        wanted = cfg.scales[run.scale].eval
        assert set(ev["tasks"]) == set(wanted.tasks)
        for task, entry in ev["tasks"].items():
            shots = {str(s) for s in wanted.shots}
            if entry["output_type"] == "loglikelihood_rolling":
                shots = {"0"}
            assert set(entry["shots"]) == shots, (run.id, task)
    bench = json.loads((out / "results/bench/decode.json").read_text())
    decoding_scale = raw["scales"][raw["experiments"]["decoding"]["scale"]]
    gpu = (decoding_scale.get("train") or {}).get("accelerator") in ("cuda", "gpu")
    dtype = raw.get("bench", {}).get("dtype", "auto")
    want = "bfloat16" if dtype == "auto" and gpu else ("float32" if dtype == "auto" else dtype)
    assert bench["settings"]["dtype"] == want


def test_rehearsal_jobs_ran_in_the_warm_server(rehearsal):
    """The DAG's jobs ran in children of its warm server (stateloop/ops/warm.py), each ended with status 0;
    it refused none, the training tasks the stand-in srun starts included (their SLURM_* variables
    are per task); and a call with fewer jobs than warm.MIN_JOBS starts no server."""
    from stateloop.ops import warm

    name, _, out = rehearsal
    log = out / ".snakemake" / "stateloop-warm.log"
    lines = log.read_text().splitlines()
    assert sum(line.startswith("serving on") for line in lines) == 1, lines[:3]
    started = [line.split(" started: ")[1].split()[0] for line in lines if " started: " in line]
    ended = [line for line in lines if " ended: " in line]
    assert len(ended) == len(started) and all('{"exit": 0}' in line for line in ended), ended
    # warm.start returns once the server listens, so every job was served: the eval jobs (depth
    # sweeps are eval jobs too, writing no eval.json) and each training task
    evals = len(list((out / "results/runs").glob("*/*/*/eval.json")))
    assert started.count("eval") >= evals, f"{started.count('eval')} of {evals} eval jobs served"
    assert [line for line in lines if line.startswith("refused")] == []
    summaries = [json.loads(p.read_text()) for p in (out / "results/runs").glob("*/*/*/train.json")]
    # a training srun starts is one `stateloop train` per task (rank), each a request of its own
    tasks = sum(s["world_size"] if s["cluster_environment"] == "SLURMEnvironment" else 1 for s in summaries)
    assert started.count("train") == tasks, f"{started.count('train')} of {tasks} training processes served"
    assert warm.MIN_JOBS > 1
    proc = dag(out, "results/claims.md", "--force")  # one job
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sum(line.startswith("serving on") for line in log.read_text().splitlines()) == 1


def test_interrupted_rehearsal_resumes_from_its_checkpoint(tmp_path):
    """configs/paper.yaml's training as rehearsed (2 "nodes" under srun, DDP over gloo, bf16
    autocast, accumulation 2): the DAG is killed once a checkpoint exists, and the rerun resumes
    that run from it without redoing a run that had finished."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not found: rehearsing paper.yaml needs the local data copies")
    from stateloop.ops.rehearse.run import environment, prepare, snakemake_command

    out = tmp_path / "paper"
    config = prepare(ROOT / "configs/paper.yaml", out)
    cfg = yaml.safe_load(config.read_text())
    train = cfg["scales"]["410m"]["train"]
    train.update(max_tokens=STEPS * train["global_batch"] * train["seq_len"])  # a checkpoint every 2 steps
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    short = "results/runs/1.4b/vanilla_looped/K4_ds0_seed1234/model.safetensors"
    long_run = out / "results/runs/410m/stateloop/K7_ds32_seed1234"

    assert dag(out, short).returncode == 0
    finished = (out / short).stat().st_mtime
    proc = subprocess.Popen(snakemake_command(out, 1, [str(long_run.relative_to(out) / "model.safetensors")]),
                            env=environment(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 600  # a hang guard: the DAG's jobs start (imports, gloo) before training
        while not list(long_run.glob("checkpoints/step_*.ckpt.sha256")):  # a complete checkpoint exists
            assert proc.poll() is None, "the training job ended before it could be interrupted"
            assert time.time() < deadline, "no checkpoint within 600 s"
            time.sleep(0.02)  # the kill must come before the last of the STEPS, however fast the machine
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the DAG, srun and both training processes die at once
        proc.wait()
    assert not (long_run / "model.safetensors").exists()
    assert dag(out, "--unlock").returncode == 0
    rerun = dag(out, short, str(long_run.relative_to(out) / "model.safetensors"))
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    summary = json.loads((long_run / "train.json").read_text())
    assert (summary.get("resumed_from_step") or 0) >= 2, summary
    assert summary["world_size"] == 2 and summary["cluster_environment"] == "SLURMEnvironment"
    assert summary["precision"] == "bf16-mixed" and summary["steps"] == STEPS
    assert (out / short).stat().st_mtime == finished  # the finished run was not redone
