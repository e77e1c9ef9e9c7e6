"""The Snakemake DAG: planning at paper scale (dry runs), config errors at DAG build, reruns of
what a changed output affects and MLflow after the smoke DAG (its rehearsal; the rehearsals of
every config, and resuming an interrupted one, are in test_rehearse.py)."""

import hashlib
import json
import os
import re
import urllib.request

import pytest
import yaml

from stateloop.config import read_config
from stateloop.experiments import expand_runs, load_pipeline
from support.dag import copy_workflow, env, jobs, snakemake
from support.rehearsals import dag, mlflow_server

pytestmark = pytest.mark.slow


def test_slurm_profile_plans_the_ten_table1_runs(tmp_path):
    work = copy_workflow(tmp_path)
    planned = jobs(snakemake(work, "--profile", "slurm", "-n", "results/table1.csv").stdout)
    trains = [j for j in planned if j["rule"] == "train"]
    evals = [j for j in planned if j["rule"] == "eval"]
    assert len(trains) == 10 and len(evals) == 10
    assert all("/1.4b/" in j["output"] for j in trains)
    models = {re.search(r"runs/1\.4b/(\w+)/", j["output"]).group(1) for j in trains}
    assert models == {"vanilla_looped", "vanilla_looped_ffn", "hyperloop", "mesh", "ponderlm", "parcae",
                      "pause_token", "stateloop", "stateloop_attn", "stateloop_mamba2"}
    for j in trains:  # the scale's GPUs and nodes (configs/paper.yaml: 4 nodes x 8 GPUs at 1.4B)
        assert "gres=gpu:8" in j["resources"] and "nodes=4" in j["resources"] and "tasks_per_node=8" in j["resources"]
    sbatch = _sbatch(_resources(trains[0]["resources"]))
    assert all(f in sbatch for f in ("--nodes=4", "--ntasks-per-node=8", "--gres=gpu:8", "--signal=USR1@")), sbatch


def test_the_410m_runs_train_on_the_1_4b_scales_tokens_which_are_tokenized_once(tmp_path):
    """configs/paper.yaml's two scales read the same source with the same tokenizer in the same
    order, 30B and 25B tokens: one tokenize job (data/1.4b), and every 410M training reads its folder."""
    work = copy_workflow(tmp_path)
    out = snakemake(work, "--profile", "slurm", "-n", "-p", "all").stdout
    planned = jobs(out)
    assert [j["output"] for j in planned if j["rule"] == "tokenize"] == ["data/1.4b/meta.json"]
    trains = [line for line in out.splitlines() if " stateloop train " in line]
    assert len(trains) == 26 and all('--data-dir "$(dirname data/1.4b/meta.json)"' in t for t in trains), trains[:2]


def test_slurms_warning_before_the_time_limit_leaves_time_to_write_each_runs_checkpoint(tmp_path):
    """Each training job's `--signal=USR1@N` comes early enough to write and hash the run's checkpoint
    (12 bytes a parameter, counted on the meta device here) at 100 MB/s, with two minutes to spare:
    360 s at 1.4B, 190 s at 410M; one N for every run was 300 s, short of the 1.4B runs' need."""
    from stateloop.models.registry import count_params

    work = copy_workflow(tmp_path)
    planned = [j for j in jobs(snakemake(work, "--profile", "slurm", "-n", "all").stdout) if j["rule"] == "train"]
    runs = {r.folder: r for r in expand_runs(load_pipeline(work / "configs/paper.yaml"))}
    lead = {}
    for job in planned:
        sbatch = _sbatch(_resources(job["resources"]))
        n = int(re.search(r"--signal=USR1@(\d+)\b", sbatch).group(1))
        run = runs[job["output"].split(", ")[0].rsplit("/", 1)[0]]
        size = 12 * count_params(run.model_config)
        assert n >= 120 + size / 100e6 + size / 1e9, (run.id, n, size)
        lead.setdefault(run.scale, set()).add(n)
    assert min(lead["1.4b"]) > 300 and max(lead["410m"]) < 300, lead


def _documented_profile(work) -> str:
    """The SLURM profile with docs/cluster.md's partition example ("**The profile**") added, as a
    user following the docs would have it: a profile folder of its own in ``work``."""
    docs = (work / "docs/cluster.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "default-resources:" in b)
    example = yaml.safe_load(block)
    profile = yaml.safe_load((work / "profiles/slurm/config.yaml").read_text())
    (work / "mine").mkdir()
    (work / "mine/config.yaml").write_text(yaml.safe_dump({**profile, **example}))
    return "mine"


def test_every_job_that_asks_for_a_gpu_goes_to_the_gpu_partition_whatever_its_rule(tmp_path):
    """Issue 53: "The documented partition example sets `default-resources: slurm_partition: cpu` and
    overrides only `train` and `eval`. `snakemake --profile slurm -n all` plans 12 more GPU jobs
    (shapley_shard x 8, interventions_shard x 2, interventions_calibration, bench_decode) that would go
    to the CPU partition with --gpus=1. Route every job that asks for a GPU to the GPU partition by one
    rule, not a list". With the docs' profile and the config's `slurm:` section, the dry run of `all`
    sends every job with a GPU (gres or gpu) to `gpu`, with the GPU type, constraint and QOS the
    section names, and every other job to the profile's `cpu`."""
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/paper.yaml").read_text())
    cfg["slurm"].update(gpu_partition="gpu", gpu_type="h100", gpu_constraint="h100|a100", gpu_qos="high")
    (work / "configs/paper.yaml").write_text(yaml.safe_dump(cfg))
    planned = jobs(snakemake(work, "--profile", _documented_profile(work), "-n", "all").stdout)
    gpu_rules, cpu_rules = set(), set()
    for job in planned:
        res = _resources(job["resources"])
        asks = res.get("gpu", 0) > 0 or "gpu" in str(res.get("gres", ""))
        (gpu_rules if asks else cpu_rules).add(job["rule"])
        assert res["slurm_partition"] == ("gpu" if asks else "cpu"), (job["rule"], res)
        assert res["slurm_account"] == "my_account"
        if not asks:
            assert not {"qos", "constraint", "gpu_model"} & set(res), (job["rule"], res)
            continue
        sbatch = _sbatch(res)
        assert "-C 'h100|a100'" in sbatch and "--qos=high" in sbatch, sbatch
        if job["rule"] == "train":
            assert "--gres=gpu:h100:8" in sbatch and "--gpus" not in sbatch, sbatch
        else:
            assert "--gpus=h100:1" in sbatch and "--gres" not in sbatch, sbatch
    assert {"train", "eval", "shapley_shard", "interventions_shard", "interventions_calibration", "bench_decode"} <= gpu_rules
    assert {"tokenize", "shapley", "interventions"} <= cpu_rules  # the merges: no GPU
    counts = {rule: sum(j["rule"] == rule for j in planned) for rule in ("shapley_shard", "interventions_shard")}
    assert counts == {"shapley_shard": 8, "interventions_shard": 2}, counts


def _resources(text: str) -> dict:
    """A dry run's `resources:` line as a dict (numbers as ints)."""
    out = {}
    for key, value in re.findall(r"(\w+)=(.*?)(?=, \w+=|$)", text):
        value = value.strip("'")
        out[key] = int(value) if value.isdigit() else value
    return out


class _Job:
    """What the SLURM executor plugin reads of a job to build its sbatch command."""

    class Resources(dict):
        __getattr__ = dict.__getitem__

    def __init__(self, resources: dict):
        self.resources = self.Resources(resources)
        self.threads = resources.get("cpus_per_task", 1)


def _sbatch(resources: dict) -> str:
    """The plugin's own sbatch command line for a planned job (it raises what it refuses)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = _Job(resources)
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "c", "account": "", "partition": "", "workdir": "."}
    return get_submit_command(job, params) + set_gres_string(job)


def _plan_train(work, train: dict, *args) -> dict:
    """The planned training job of one smoke run whose `train:` section is updated with ``train``."""
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    cfg["scales"]["smoke"]["train"].update(train)
    (work / "geometry.yaml").write_text(yaml.safe_dump(cfg))
    target = "results/runs/smoke/vanilla_looped/K2_ds0_seed1234/model.safetensors"
    out = snakemake(work, *args, "-n", "-p", target, "--configfile", "geometry.yaml").stdout
    (job,) = [j for j in jobs(out) if j["rule"] == "train"]
    job["shell"] = next(line for line in out.splitlines() if "stateloop train" in line)
    return job


@pytest.mark.parametrize("train,expect,refuse", [
    # one device per node on several nodes: the plugin refuses tasks_per_node = 1 for "mpi" jobs
    ({"accelerator": "cuda", "devices": 1, "num_nodes": 2}, ["--nodes=2", "--ntasks=2", "--gres=gpu:1"], ["--ntasks-per-node"]),
    # accelerator auto asks for the GPUs (a SLURM job sees only those it asked for); one node, two tasks
    ({"accelerator": "auto", "devices": 2, "num_nodes": 1}, ["--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"], ["--ntasks="]),
    # the smoke scale: one task on the CPU
    ({"accelerator": "cpu", "devices": 1, "num_nodes": 1}, ["--nodes=1", "--ntasks=1"], ["--gres", "--ntasks-per-node"]),
])
def test_slurm_training_job_asks_for_one_task_per_device_and_the_time_limit_warning(tmp_path, train, expect, refuse):
    """Issue: "a config with num_nodes > 1 and devices: 1 cannot be submitted (the plugin refuses
    tasks_per_node 1 with mpi); accelerator: auto requests no GPU from SLURM". Every geometry gives
    an sbatch command the plugin builds, with SIGUSR1 to the job steps before the time limit, and an
    `mpi` resource, so that the job step runs the rule in the batch script (no `srun -n1` around it),
    where the launcher starts training as a job step of its own."""
    work = copy_workflow(tmp_path)
    job = _plan_train(work, train, "--profile", "slurm")
    resources = _resources(job["resources"])
    sbatch = _sbatch(resources)
    for flag in expect + ["--signal=USR1@120", "--open-mode=append"]:  # 120 s: the margin, a tiny run's checkpoint
        assert flag in sbatch, (flag, sbatch)
    for flag in refuse:
        assert flag not in sbatch, (flag, sbatch)
    assert "mpi" in resources


def test_slurm_job_starts_training_as_a_job_step_on_one_node_too(tmp_path, monkeypatch):
    """SLURM's `--signal=USR1@N` reaches job steps only: inside the SLURM job (the rule runs in
    remote mode with SLURM_JOB_ID set) one-node training runs under srun, one task per device;
    a local run, and the main Snakemake process's plan, start it without srun."""
    work = copy_workflow(tmp_path)
    one_node = {"accelerator": "cpu", "devices": 2, "num_nodes": 1}
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    in_job = _plan_train(work, one_node, "--mode", "remote")["shell"]
    assert "srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 stateloop train" in in_job, in_job
    local = _plan_train(work, one_node)["shell"]  # e.g. a local Snakemake inside an salloc allocation
    assert "srun" not in local and " stateloop train" in local, local
    # the rule's log starts with the run folder's train.log, which every attempt appends to
    assert re.search(r"cat (\S+)/train\.log > logs/train/\S+\.log", in_job) and "tee -a" in in_job, in_job


def test_a_slurm_job_uses_the_cpus_it_was_given_not_the_submit_hosts_cores(tmp_path, monkeypatch):
    """The request: "A job submitted to SLURM uses the cores it asked for (today the inner job inherits
    `--cores` from the submit host's profile)". The plugin starts the rule job with the submit
    host's --cores (here 1); inside the SLURM job (remote mode, SLURM_JOB_ID set) the job's threads,
    which Snakemake exports as OMP_NUM_THREADS, are the CPUs SLURM gave it (SLURM_CPUS_ON_NODE = 4,
    the 4 it asked for), and stay capped at --cores outside one."""
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    cfg["scales"]["smoke"]["resources"]["train"]["cpus_per_task"] = 4
    (work / "cpus.yaml").write_text(yaml.safe_dump(cfg))
    target = "results/runs/smoke/vanilla_looped/K2_ds0_seed1234/model.safetensors"

    def threads(*args):
        out = snakemake(work, *args, "-n", "--cores", "1", target, "--configfile", "cpus.yaml").stdout
        (job,) = [j for j in jobs(out) if j["rule"] == "train"]
        return int(job.get("threads", 1)), _resources(job["resources"])["cpus_per_task"]

    assert threads() == (1, 4)  # a local run: at most --cores
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "4")
    assert threads("--mode", "remote") == (4, 4)
    assert threads() == (1, 4)  # a local Snakemake inside an allocation keeps its own --cores


def test_claims_scale_plans_every_seed_and_only_the_outputs_it_defines(tmp_path):
    """configs/decide.yaml: 15 cells x 4 seeds, 4 more seeds of Table 1's two cells, and the lr
    bracket's 12 new cells x 3 seeds and 3 more seeds of the 9e-3 cells (its 3e-3 is Figure 2's runs), the authors'
    recipe's 8 cells x 4 seeds, the precision A/B's 2 cells x 4 seeds, one training each, seeds
    spelled in every path; Tables 1 and 4, Figure 2, the gap over training tokens, the state's
    diagnostics, the lr bracket and the claims are its outputs (no Table 2: no lm-eval task), and each
    experiment of two models that none of them reads has a comparison of its own (the authors' recipe
    at each lr, which varies K, with its figure; the precision A/B, at one K)."""
    work = copy_workflow(tmp_path)
    planned = jobs(snakemake(work, "-n", "--configfile", "configs/decide.yaml").stdout)
    trains = [j["output"] for j in planned if j["rule"] == "train"]
    assert len(trains) == len(set(trains)) == 68 + 48 + 32 + 8
    assert sum("/decide_bf16/" in o and "/K4_ds" in o for o in trains) == 8  # bf16-mixed against lr_2's float32 runs
    assert all(re.search(r"/K\d+_ds\d+_seed[1-8]/model\.safetensors", o) for o in trains)
    assert sum("/K4_ds" in o and "/decide/" in o for o in trains) == 16
    assert sum("/decide_input/" in o for o in trains) == 8  # the read-init choice: K = 3, 7 x 4 seeds
    assert sum(re.search(r"/decide_lr_(low|top)/", o) is not None for o in trains) == 24  # 2 lrs x 2 models x 2 K x 3 seeds
    # the recipe A/B: the authors' recipe at 3e-3 and 9e-3 x 2 models x 2 K x 4 seeds (the project's side: the bracket's runs)
    assert sum(re.search(r"/decide_authors(_lr_high)?/", o) is not None for o in trains) == 32
    assert sum("/decide_lr_high/" in o for o in trains) == 24  # 9e-3: 2 models x 2 K x 6 seeds
    renders = sorted(j["output"] for j in planned if j["rule"].startswith("render"))
    assert renders == sorted(["figures/loop_depth.pdf, figures/loop_depth.png", "results/claims.md, results/claims.csv",
                              "results/table1.csv, results/table1.md", "results/table4.csv, results/table4.md",
                              "figures/gap_vs_tokens.pdf, figures/gap_vs_tokens.png",
                              "figures/state_diagnostics.pdf, figures/state_diagnostics.png",
                              "figures/test_time_depth.pdf, figures/test_time_depth.png",
                              "figures/lr_sweep.pdf, figures/lr_sweep.png",
                              "results/compare_authors_lr_1.csv, results/compare_authors_lr_1.md",
                              "figures/compare_authors_lr_1.pdf, figures/compare_authors_lr_1.png",
                              "results/compare_authors_lr_2.csv, results/compare_authors_lr_2.md",
                              "figures/compare_authors_lr_2.pdf, figures/compare_authors_lr_2.png",
                              "results/compare_precision_bf16.csv, results/compare_precision_bf16.md"])


def test_test_time_depths_evaluate_the_trained_runs_without_training_more(tmp_path):
    """The request: "An experiment key (test_time_K) adds these evaluations to the DAG for the runs it
    names; held-out PPL only by default". configs/decide.yaml's test_time_depth names Figure 2's
    runs: no training beyond Figure 2's, one eval_depth job per run (40), each at every listed
    depth with no lm-eval task; its figure reads them, and the claims read the figure's inputs."""
    work = copy_workflow(tmp_path)
    out = snakemake(work, "-n", "-p", "--configfile", "configs/decide.yaml").stdout
    planned = jobs(out)
    cfg = load_pipeline(work / "configs/decide.yaml")
    named = {r.id for r in expand_runs(cfg, ["test_time_depth"])}
    assert named <= {r.id for r in expand_runs(cfg, ["loop_depth"])}  # Figure 2's runs, trained once
    depth_jobs = [j for j in planned if j["rule"] == "eval_depth"]
    assert len(depth_jobs) == len(named) == 40
    assert {j["output"].removeprefix("results/runs/").removesuffix("/eval_depth.json") for j in depth_jobs} == named
    shells = [line for line in out.splitlines() if "--depths" in line]
    assert len(shells) == 40
    assert all("--depths 1 2 3 4 5 6 7 8 9 10 12 14 " in line and "--tasks" not in line for line in shells), shells[0]
    # no lm-eval task: the command reads that from the config (pipeline.Run.scores_tasks)
    assert not any(r.scores_tasks(depths=True) for r in expand_runs(cfg, ["test_time_depth"]))


def test_the_ladder_plans_its_rungs_and_only_its_outputs(tmp_path):
    """configs/ladder.yaml: 3 rungs x (StateLoop, Vanilla Looped) x K = 4, 7 x 6 seeds, one training
    each; its outputs are the gap against compute and the claims."""
    work = copy_workflow(tmp_path)
    planned = jobs(snakemake(work, "-n", "--configfile", "configs/ladder.yaml").stdout)
    trains = [j["output"] for j in planned if j["rule"] == "train"]
    assert len(trains) == len(set(trains)) == 72
    assert {re.search(r"runs/(ladder_\w)/", o).group(1) for o in trains} == {"ladder_s", "ladder_m", "ladder_l"}
    renders = sorted(j["output"] for j in planned if j["rule"].startswith("render"))
    assert renders == ["figures/gap_vs_compute.pdf, figures/gap_vs_compute.png", "results/claims.md, results/claims.csv"]


def test_the_ladders_lr_overlay_adds_each_rungs_bracket_to_the_same_dag(tmp_path):
    """`snakemake --configfile configs/overlays/ladder_lr.yaml` (its `base:` is ladder.yaml), or
    with both files named as before: the overlay's experiments merged into the ladder, so the DAG
    plans the ladder's 72 trainings and the 8 bracket points' 96 (2 models x K = 4 x 6 seeds each),
    one tokenization and the same outputs, and each point's comparison of its own (one K: a table)."""
    work = copy_workflow(tmp_path)
    plans = [jobs(snakemake(work, "-n", "--configfile", *files).stdout)
             for files in (["configs/ladder.yaml", "configs/overlays/ladder_lr.yaml"], ["configs/overlays/ladder_lr.yaml"])]
    assert sorted((j["rule"], j.get("output", "")) for j in plans[0]) == sorted((j["rule"], j.get("output", "")) for j in plans[1])
    planned = plans[0]
    trains = [j["output"] for j in planned if j["rule"] == "train"]
    assert len(trains) == len(set(trains)) == 72 + 96
    points = [o for o in trains if re.search(r"runs/ladder_[sml]_lr_\w+/", o)]
    assert len(points) == 96 and all("/K4_ds" in o for o in points)
    assert sum(j["rule"] == "tokenize" for j in planned) == 1
    renders = sorted(j["output"] for j in planned if j["rule"].startswith("render") and j["rule"] != "render_comparison")
    assert renders == ["figures/gap_vs_compute.pdf, figures/gap_vs_compute.png", "results/claims.md, results/claims.csv"]
    compared = sorted(j["output"].split(",")[0] for j in planned if j["rule"] == "render_comparison")
    assert compared == sorted(f"results/compare_{e}.csv" for e in yaml.safe_load(
        (work / "configs/overlays/ladder_lr.yaml").read_text())["experiments"])


def test_an_experiment_file_of_its_own_trains_only_its_new_runs_and_renders_its_comparison(tmp_path):
    """An experiment in a file of its own over smoke.yaml (`base:`), 2 models x 2 K x 3 seeds:
    `snakemake --configfile F results/compare_NAME.md figures/compare_NAME.pdf` plans the 12
    trainings the base lacks and no other, one evaluation each, and the comparison's table and
    figure from those runs' eval.json; every job reads the resolved config."""
    work = copy_workflow(tmp_path)
    idea = work / "configs" / "experiments" / "idea.yaml"
    idea.parent.mkdir(exist_ok=True)
    idea.write_text("base: ../smoke.yaml\nexperiments:\n  idea:\n    scale: smoke\n"
                    "    models: [vanilla_looped, stateloop_gru]\n    K: [2, 3]\n    d_s: [32]\n    seeds: [1, 2, 3]\n")
    planned = jobs(snakemake(work, "results/compare_idea.md", "figures/compare_idea.pdf", "-n",
                             "--configfile", "configs/experiments/idea.yaml").stdout)
    cfg = load_pipeline(idea)
    runs = {r.folder for r in expand_runs(cfg, ["idea"])}
    assert len(runs) == 12
    assert {j["output"].split(",")[0].rsplit("/", 1)[0] for j in planned if j["rule"] == "train"} == runs
    assert {j["output"].rsplit("/", 1)[0] for j in planned if j["rule"] == "eval"} == runs
    assert sorted(j["rule"] for j in planned if j["rule"].startswith("render")) == ["render_comparison", "render_comparison_figure"]
    # every job reads the file resolved, its base merged under it (the config file named by its content)
    out = snakemake(work, "results/compare_idea.md", "-n", "-p", "--configfile", "configs/experiments/idea.yaml").stdout
    digest = hashlib.sha256(yaml.safe_dump(read_config(idea), sort_keys=True).encode()).hexdigest()[:16]
    assert f"stateloop render compare --experiment idea --config results/configs/{digest}.yaml" in out


def test_the_gpu_ladder_plans_its_rungs_on_one_gpu_each(tmp_path):
    """The request: "The same ladder for one GPU (on configs/gpu.yaml's data and tokenizer, rungs up
    to its ~110M model), with `stateloop plan` figures for its cost". configs/ladder_gpu.yaml: 3
    rungs x 2 models x K = 4, 7 x 3 seeds on one GPU each, gpu.yaml's data and tokenizer, its
    largest rung gpu.yaml's own shape and budget; the plan prints each run's GPU-hours."""
    import subprocess
    import sys

    work = copy_workflow(tmp_path)
    planned = jobs(snakemake(work, "-n", "--configfile", "configs/ladder_gpu.yaml").stdout)
    trains = [j for j in planned if j["rule"] == "train"]
    assert len(trains) == len({j["output"] for j in trains}) == 36
    assert {re.search(r"runs/(gpu_ladder_\w)/", j["output"]).group(1) for j in trains} == {
        "gpu_ladder_s", "gpu_ladder_m", "gpu_ladder_l"}
    assert all("gres=gpu:1" in j["resources"] for j in trains)
    renders = sorted(j["output"] for j in planned if j["rule"].startswith("render"))
    assert renders == ["figures/gap_vs_compute.pdf, figures/gap_vs_compute.png", "results/claims.md, results/claims.csv"]
    ladder, gpu = (yaml.safe_load((work / f"configs/{n}.yaml").read_text())["scales"] for n in ("ladder_gpu", "gpu"))
    assert all(s["data"] == gpu["gpu"]["data"] for s in ladder.values())
    largest = ladder["gpu_ladder_l"]
    assert {k: largest["model"][k] for k in ("d_model", "n_layers", "d_ff")} == \
        {k: gpu["gpu"]["model"][k] for k in ("d_model", "n_layers", "d_ff")}
    assert largest["train"]["max_tokens"] == gpu["gpu"]["train"]["max_tokens"]
    plan = subprocess.run([sys.executable, "-m", "stateloop.cli", "plan", "--config", "configs/ladder_gpu.yaml"],
                          cwd=work, capture_output=True, text=True, check=True).stdout
    hours = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\s+(ladder_\d)\s+12 runs\s+\S+ FLOPs\s+([\d.]+) GPU-h", plan, re.M)}
    assert set(hours) == {"ladder_1", "ladder_2", "ladder_3"} and hours["ladder_1"] < hours["ladder_2"] < hours["ladder_3"]


def test_decoding_benchmark_runs_alone(tmp_path):
    """Table 3 is timed with no other job beside it: locally it takes every core Snakemake has,
    under SLURM a whole node."""
    work = copy_workflow(tmp_path)
    cores = os.cpu_count() or 1  # the most a job's threads may be (all_cores, workflow/rules/common.smk)
    planned = jobs(snakemake(work, "-n", "--cores", str(cores), "results/bench/decode.json").stdout)
    bench = next(j for j in planned if j["rule"] == "bench_decode")
    others = [j for j in planned if j["rule"] != "bench_decode"]
    assert "slurm_extra='--exclusive'" in bench["resources"]
    if cores < 2:
        pytest.skip("one core: every job runs alone, and the plan cannot show the benchmark taking more cores than the others")
    assert bench.get("threads") == str(cores) and all(j.get("threads", "1") == "1" for j in others)


def test_paper_config_plans_26_training_runs_once_each(tmp_path):
    work = copy_workflow(tmp_path)
    # Targets go before --configfile, which takes every following word as a config file.
    planned = jobs(snakemake(work, "-n", "all", "--configfile", "configs/paper.yaml").stdout)
    outputs = [j["output"] for j in planned if j["rule"] == "train"]
    assert len(outputs) == 26 and len(set(outputs)) == 26
    assert sum("/1.4b/" in o for o in outputs) == 10 and sum("/410m/" in o for o in outputs) == 16


@pytest.mark.parametrize("edit,needle", [
    (lambda c: c["scales"]["smoke"]["model"].update(d_modle=3), "scales.smoke.model.d_modle: unknown key"),
    (lambda c: c["experiments"]["table4"].update(models=["stateloop", "stateloop_xl"]), "unknown model 'stateloop_xl'"),
    (lambda c: c["scales"]["smoke"]["train"].update(lr="fast"), "scales.smoke.train.lr: expected a number"),
    (lambda c: c["experiments"].update(idea={"scale": "smoke", "models": ["stateloop", "stateloop_gru"], "d_s": [32]}),
     "bad.yaml: experiments.idea.baseline: missing: its models (stateloop, stateloop_gru) are each compared with a baseline"),
    # the cluster's check (ops/cluster.py), which the Snakefile calls itself: pipeline.py's knows no cluster
    (lambda c: c.setdefault("slurm", {}).update(max_runtime=1), "min is above slurm.max_runtime = 1 min"),
])
def test_bad_config_fails_at_dag_build_naming_the_key(tmp_path, edit, needle):
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    edit(cfg)
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if needle in line]
    assert lines, proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout  # nothing was planned, let alone run


# Every Python process started with this on its path writes the torch modules it holds at exit.
TORCH_RECORDER = """import atexit, os, sys

def _record():
    with open(os.path.join(os.environ["TORCH_RECORD_DIR"], str(os.getpid())), "w") as f:
        f.write(" ".join(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))

atexit.register(_record)
"""


def test_parsing_the_snakefile_and_planning_import_no_torch(tmp_path):
    """Every Snakemake process (each dry run, each DAG, the Snakemake inside every SLURM job)
    parses the Snakefile, which checks the config against the model registry: that must not
    import torch (about 2 CPU-seconds a process)."""
    work = copy_workflow(tmp_path / "wf")
    site, record = tmp_path / "site", tmp_path / "record"
    site.mkdir()
    record.mkdir()
    (site / "sitecustomize.py").write_text(TORCH_RECORDER)
    proc = snakemake(work, "-n", "--configfile", "configs/smoke.yaml",
                     extra_env={"PYTHONPATH": f"{site}{os.pathsep}{env()['PYTHONPATH']}", "TORCH_RECORD_DIR": str(record)})
    assert "Job stats" in proc.stdout  # the DAG was built and planned
    recorded = {p.name: p.read_text() for p in record.iterdir()}
    assert recorded and not any(recorded.values()), recorded


def test_lint_reports_nothing_serious(tmp_path):
    work = copy_workflow(tmp_path)
    proc = snakemake(work, "--lint", "--configfile", "configs/smoke.yaml", check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "Lints for" not in text, text


def _files(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file() and ".snakemake" not in p.parts}


def test_a_job_reads_the_config_it_was_scheduled_with_and_dry_runs_write_nothing(tmp_path):
    """The request: "Every snakemake call rewrites results/config.yaml, dry runs and lock-refused calls
    included, and running jobs read that file when they start ... A job's config must be fixed
    when the job is scheduled, and a change of the effective config must rerun what it affects."
    """
    work = copy_workflow(tmp_path)
    (work / "lr.yaml").write_text("scales: {smoke: {train: {lr: 0.01}}}\n")  # merged over smoke.yaml
    (work / "docs.yaml").write_text("scales: {smoke: {data: {synthetic: {train_docs: 500}}}}\n")
    before = _files(work)
    for args in (["-n"], ["-n", "--configfile", "configs/smoke.yaml", "lr.yaml"], ["--lint"]):
        snakemake(work, *args, *([] if "--configfile" in args else ["--configfile", "configs/smoke.yaml"]), check=False)
        assert _files(work) == before, args  # no results/, no config file, nothing rewritten
    snakemake(work, "data/smoke/meta.json", "--cores", "1", "--configfile", "configs/smoke.yaml")
    (written,) = (work / "results/configs").iterdir()
    assert yaml.safe_load(written.read_text()) == yaml.safe_load((work / "configs/smoke.yaml").read_text())
    log = (work / "logs/tokenize/smoke.log").read_text()
    # a plan with another lr: its jobs would read another file; the written one is untouched and
    # the tokenize job (which does not read train.*) is not redone, the trainings are
    text = written.read_bytes()
    planned = jobs(snakemake(work, "-n", "--configfile", "configs/smoke.yaml", "lr.yaml").stdout)
    assert written.read_bytes() == text and len(list((work / "results/configs").iterdir())) == 1
    assert "tokenize" not in {j["rule"] for j in planned} and "train" in {j["rule"] for j in planned}
    assert log == (work / "logs/tokenize/smoke.log").read_text()
    # a change the tokenizer reads redoes it
    assert "tokenize" in {j["rule"] for j in jobs(snakemake(work, "-n", "--configfile", "configs/smoke.yaml", "docs.yaml").stdout)}


# ----------------------------------------------------------------------------------------------
# The smoke DAG, run once for the tests below (tests/workflow/conftest.py)


def test_touching_one_training_output_reruns_only_its_dependents(smoke_dag):
    assert "Nothing to be done" in dag(smoke_dag, "-n").stdout
    # Snakemake compares checksums of small files (under --max-checksum-file-size), so a bare
    # touch of the smoke model changes nothing: write the weights file anew, as retraining does.
    from stateloop.files import read_safetensors, write_safetensors

    model = smoke_dag / "results/runs/tiny/stateloop_gru/K7_ds32_seed1234/model.safetensors"
    state, metadata = read_safetensors(model, True)
    write_safetensors(model, {k: v.clone() for k, v in state.items()}, {**metadata, "code_version": "retrained"})
    planned = jobs(dag(smoke_dag, "-n").stdout)
    rules = sorted(j["rule"] for j in planned)
    # Table 4 only: its eval, the table, the claims, Figure S2 (the state's diagnostics read Table 4's eval.json)
    # and the gru_update comparison (it reads Table 4's K = 7 runs)
    assert rules == ["all", "eval", "render_claims", "render_comparison", "render_figure", "render_table"], rules
    assert "compare_gru_update" in next(j for j in planned if j["rule"] == "render_comparison")["output"]
    assert "stateloop_gru" in next(j for j in planned if j["rule"] == "eval")["output"]
    assert "table4" in next(j for j in planned if j["rule"] == "render_table")["output"]
    assert "state_diagnostics" in next(j for j in planned if j["rule"] == "render_figure")["output"]


def test_mlflow_server_lists_every_run(smoke_dag):
    with mlflow_server(smoke_dag) as base:
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/experiments/search", data=b'{"max_results": 100}',
                                     headers={"Content-Type": "application/json"})
        exps = json.load(urllib.request.urlopen(req, timeout=10))["experiments"]
        body = json.dumps({"experiment_ids": [e["experiment_id"] for e in exps], "max_results": 1000}).encode()
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", data=body,
                                     headers={"Content-Type": "application/json"})
        runs = json.load(urllib.request.urlopen(req, timeout=10)).get("runs", [])
        names = {r["info"]["run_name"] for r in runs}
        expected = {str(p.relative_to(smoke_dag / "results/runs")) for p in (smoke_dag / "results/runs").glob("*/*/*")}
        cfg = load_pipeline(smoke_dag / "config.yaml")
        assert expected == {r.id for r in expand_runs(cfg)}
        assert expected <= names, sorted(expected - names)




def test_the_export_rule_turns_a_trained_run_into_a_hugging_face_directory(tmp_path):
    """`snakemake exports` plans one export per run, each after its training; the rule's job, run
    on a run folder as training leaves it (weights saved here, not trained), writes the directory."""
    from stateloop.config import to_dict
    from stateloop.data.shards import write_meta
    from stateloop.data.tokenizer import EOS, train_bpe
    from stateloop.files import atomic_write_json
    from stateloop.models.registry import build_model
    from stateloop.runs import save_final, saved_config

    work = copy_workflow(tmp_path)
    runs = expand_runs(load_pipeline(work / "configs/smoke.yaml"))
    planned = jobs(snakemake(work, "--configfile", "configs/smoke.yaml", "-n", "exports").stdout)
    exports = sorted(j["output"] for j in planned if j["rule"] == "export")
    assert exports == sorted(f"results/exports/{r.id}" for r in runs)
    assert {j["output"].split(", ")[0].rsplit("/", 1)[0].replace("runs/", "exports/", 1) for j in planned if j["rule"] == "train"} \
        == set(exports)

    run = runs[0]
    data = work / "data" / run.scale
    data.mkdir(parents=True)
    tok = train_bpe([f"the cat sat on mat {i}" for i in range(50)], 300)
    tok.save(str(data / "tokenizer.json"))
    write_meta(data, {"vocab_size": tok.get_vocab_size(), "eos_id": tok.token_to_id(EOS), "tokenizer": {"file": "tokenizer.json"}})
    folder = work / run.folder
    config = {"run": {"id": run.id, "scale": run.scale}, "model": to_dict(run.model_config), "data": {"dir": str(data)}}
    save_final(folder, build_model(run.model_config).eval(), config)
    atomic_write_json(folder / "train.json", {"run": run.id})
    stamp = (data / "meta.json").stat().st_mtime - 60
    os.utime(data / "meta.json", (stamp, stamp))  # the shards before the weights, as training leaves them
    snakemake(work, f"results/exports/{run.id}", "--configfile", "configs/smoke.yaml", "--cores", "1",
              "--allowed-rules", "export", "--rerun-triggers", "mtime")
    out = work / "results/exports" / run.id
    hf = json.loads((out / "config.json").read_text())
    assert hf["auto_map"]["AutoModelForCausalLM"] == "modeling_stateloop.StateLoopForCausalLM"
    assert hf["stateloop_model"] == config["model"] and saved_config(out) == config
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "modeling_stateloop.py", "stateloop_models_registry.py"} <= names


def test_every_rule_quotes_the_paths_and_wildcards_of_its_shell_command():
    """The request: "Quote every wildcard in every rule's shell command (the tokenize rule does not)":
    every wildcard, log, output, input and file-naming param in a shell string is written ``{...:q}``."""
    from pathlib import Path

    rules = Path(__file__).resolve().parents[2] / "workflow" / "rules"
    unquoted = re.compile(r"\{(wildcards\.\w+|log|output(\.\w+)?|input(\.\w+)?|params\.(config|run_dir|run|scale))\}")
    found = [f"{path.name}: {line.strip()}" for path in sorted(rules.glob("*.smk"))
             for line in path.read_text().splitlines() if line.strip().startswith('"') and unquoted.search(line)]
    assert found == [], found


def test_a_changed_train_lr_reruns_the_run_afresh_instead_of_deleting_its_weights_and_refusing(tmp_path):
    """The request: "Changing train.lr and rerunning the DAG: Snakemake plans the retrain, deletes the
    finished run's model.pt and train.json, and then stateloop train refuses ... the run is left
    without weights". The rerun trains the run afresh with the new lr, saying so in its log."""
    work = copy_workflow(tmp_path)
    cfg = yaml.safe_load((work / "configs/smoke.yaml").read_text())
    cfg["scales"]["smoke"]["train"].update(max_tokens=8 * 512, checkpoint_every=4, val_every=0, val_tokens=0)  # 8 steps
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    run = work / "results/runs/smoke/vanilla_looped/K2_ds0_seed1234"
    target = str((run / "train.json").relative_to(work))
    snakemake(work, "--cores", "1", target, "--configfile", "c.yaml")
    cfg["scales"]["smoke"]["train"]["lr"] = 1e-3
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(work, "--cores", "1", target, "--configfile", "c.yaml")
    log = (run / "train.log").read_text()
    assert ("train.lr: 0.001 differs from 0.003 in results/runs/smoke/vanilla_looped/K2_ds0_seed1234/config.yaml, and a "
            "resumed optimizer and schedule would keep 0.003: starting the run afresh (--restart-on-change)") in log, log[-2000:]
    summary = json.loads((run / "train.json").read_text())
    assert summary["resumed_from_step"] is None and summary["steps"] == 8
    from stateloop.runs import saved_config

    assert saved_config(run)["train"]["lr"] == 1e-3
