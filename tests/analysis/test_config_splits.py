"""Figure 4's analyses on the data every pipeline config actually makes, and on the held-out set
of Table 4's perplexity.

For every ``configs/*.yaml`` (the folder is enumerated, so a new config is covered): the DAG
dry-runs, and the ``stateloop analyze`` commands it plans for the state_analysis run run as
planned (no split flags) on a tiny run folder laid out as the DAG leaves it: a tiny model of the
run's name and K at ``results/runs/{run id}``, and token shards at ``data/{scale}`` holding only
the splits that the config's ``data:`` section makes. Then, on one run, the analyses' unmodified
baseline is the held-out perplexity that ``stateloop eval`` writes to eval.json.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from stateloop.cli import main
from stateloop.config import to_dict
from stateloop.data.shards import ShardWriter, sha256_file, token_dtype, write_meta
from stateloop.experiments import expand_runs, load_pipeline
from stateloop.models.registry import build_model, get_spec
from stateloop.runs import save_final
from support.dag import copy_workflow, snakemake

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
VOCAB = 61
SEQ = 16  # the tiny run's train.seq_len: the window length unless eval.max_length sets one
HELDOUT_WINDOWS = 5  # windows in each held-out split of the tiny shards
TRAIN_WINDOWS = 24


def write_data(data_dir: Path, splits, seq_len: int = SEQ, seed: int = 0) -> None:
    """Token shards of exactly ``splits`` (several shards each) and a word-level tokenizer
    (id 0 the end-of-document token), with the meta.json of the data stage."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    data_dir.mkdir(parents=True, exist_ok=True)
    vocab = {"<|endoftext|>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(data_dir / "tokenizer.json"))
    rng = np.random.default_rng(seed)
    entries = {}
    for split in splits:
        n = (TRAIN_WINDOWS if split == "train" else HELDOUT_WINDOWS) * seq_len + 1
        w = ShardWriter(data_dir, split, token_dtype(VOCAB), shard_tokens=37)
        w.add(rng.integers(0, VOCAB, n))
        entries[split] = w.close()
    write_meta(data_dir, {"dtype": token_dtype(VOCAB).name, "vocab_size": VOCAB, "eos_id": 0, "eos_token": "<|endoftext|>",
                          "tokenizer": {"file": "tokenizer.json", "sha256": sha256_file(data_dir / "tokenizer.json")},
                          "splits": entries})


def tiny_model_config(run, max_seq_len: int = 64):
    """The run's model (name, K, options) at a tiny shape: d = 16, one layer."""
    cfg = dataclasses.replace(
        run.model_config, vocab_size=VOCAB, n_layers=1, d_model=16, d_ff=32, n_heads=2, head_dim=8,
        d_s=16 if run.model_config.d_s else 0, max_seq_len=max_seq_len, init_std=0.2, mixer_heads=2,
        mixer_head_dim=8, mamba_d_state=8, mamba_head_dim=8, mamba_n_groups=1, mamba_chunk_size=8,
        attn_impl="torch", ssd_impl="torch")
    get_spec(cfg.name).check(cfg)
    return cfg


def save_tiny_run(run_dir: Path, run, data_dir: Path, pipeline_config: str, max_seq_len: int = 64) -> None:
    """RUN_DIR/model.safetensors as training leaves it: weights and the resolved config (run, model, train, data)."""
    import torch

    torch.manual_seed(0)
    mcfg = tiny_model_config(run, max_seq_len)
    config = {"run": {"id": run.id, "scale": run.scale,
                      "config": pipeline_config, "experiments": run.experiments},
              "model": to_dict(mcfg), "train": {"seq_len": SEQ}, "data": {"dir": str(data_dir.resolve())}}
    save_final(run_dir, build_model(mcfg).eval(), config)


def planned_analyses(dry_run_stdout: str) -> list[str]:
    """The ``stateloop analyze ...`` shell commands of a ``snakemake -n -p`` run."""
    return [m.group(1) for m in re.finditer(r"^Shell command: (stateloop analyze .*)$", dry_run_stdout, re.M)]


@pytest.mark.slow  # a Snakemake dry run per config (seconds each)
@pytest.mark.parametrize("config_file", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_dag_analysis_jobs_run_on_the_splits_the_config_makes(config_file, tmp_path, monkeypatch):
    work = copy_workflow(tmp_path / "work")
    planned = planned_analyses(snakemake(work, "-n", "-p", "all", "--configfile", f"configs/{config_file.name}").stdout)
    pipe = load_pipeline(config_file)
    if "state_analysis" not in pipe.experiments:  # decide.yaml: no Figure 4, so no analysis job either
        assert planned == []
        return
    runs = expand_runs(pipe, ["state_analysis"])
    # Per run: an analysis of one shard is one job; of N > 1, N shard jobs (after one calibration
    # job for the interventions) and a merge (resources.analyze.*_shards).
    expected_jobs = []
    for run in runs:
        res = pipe.scales[run.scale].resources.analyze
        for analysis in ("shapley", "interventions"):
            n = getattr(res, f"{analysis}_shards")
            if n == 1:
                expected_jobs.append((run.folder, analysis, ""))
                continue
            expected_jobs += [(run.folder, analysis, f"--shard {i}/{n}") for i in range(1, n + 1)]
            expected_jobs.append((run.folder, analysis, f"--merge {n}"))
            if analysis == "interventions":
                expected_jobs.append((run.folder, analysis, "--calibrate-only"))
    flags = re.compile(r"--shard \d+/\d+|--merge \d+|--calibrate-only")
    planned_jobs = [(c.split()[3], c.split()[2], " ".join(flags.findall(c))) for c in planned]
    assert sorted(planned_jobs) == sorted(expected_jobs), planned
    # in the order of the DAG: the calibration, then the shards, then the merges and whole analyses
    planned.sort(key=lambda c: 0 if "--calibrate-only" in c else 1 if "--shard" in c else 2)
    # the job's config, as a real (not dry) run writes it when it starts jobs: results/configs/<sha256>.yaml
    (job_config,) = {re.search(r"--config (\S+)", c).group(1) for c in planned}
    (work / job_config).parent.mkdir(parents=True, exist_ok=True)
    (work / job_config).write_text(yaml.safe_dump(yaml.safe_load(config_file.read_text()), sort_keys=True))
    expected = {}
    for run in runs:
        scale = pipe.scales[run.scale]
        splits = scale.data.splits
        assert scale.eval.heldout_split in splits, (config_file.name, run.scale, splits)
        seq_len = scale.eval.max_length or SEQ
        data_dir = work / "data" / run.scale
        if not (data_dir / "meta.json").exists():
            write_data(data_dir, splits, seq_len)
        save_tiny_run(work / run.folder, run, data_dir, job_config, max_seq_len=max(64, seq_len))
        windows = min(HELDOUT_WINDOWS, scale.eval.heldout_windows or HELDOUT_WINDOWS)
        expected[run.folder] = (scale.eval.heldout_split, windows, seq_len, splits)

    monkeypatch.chdir(work)
    scale_of = {run.folder: run.scale for run in runs}
    baseline = {}
    for command in planned:
        argv = shlex.split(command.split(" > ")[0])  # without the log redirection
        assert argv[0] == "stateloop" and not any(a.startswith(("--split", "--eval-split", "--calib-split")) for a in argv)
        assert main(argv[1:] + ["--no-mlflow"]) == 0, command
        analysis, folder = argv[2], argv[3]
        if "--shard" in argv or "--calibrate-only" in argv:
            continue  # a part of the analysis: its merge writes the JSON
        split, windows, seq_len, splits = expected[folder]
        res = json.loads((work / folder / f"{analysis}.json").read_text())
        held = res["heldout"]
        assert (held["split"], held["windows"], held["seq_len"], held["tokens"]) == (split, windows, seq_len, windows * seq_len)
        assert held["matches_eval_protocol"] is True
        if analysis == "interventions":
            assert res["settings"]["calib_split"] == "train" != split
            assert res["calibration"]["windows"] == min(64, TRAIN_WINDOWS) and "train" in splits
            assert held["nll"] == res["unmodified"]["nll"]
        else:
            assert held["nll"] == res["nll_none_masked"] and len(res["masks"]) == 2 ** res["K"]
        shards = getattr(pipe.scales[scale_of[folder]].resources.analyze, f"{analysis}_shards")
        assert res["settings"]["shards"] == shards
        baseline.setdefault(folder, []).append(held["nll"])
    for folder, nlls in baseline.items():  # shapley's all-reads-kept NLL = interventions' unmodified NLL
        assert len(nlls) == 2 and nlls[0] == pytest.approx(nlls[1], rel=1e-6), folder


def test_analyses_share_the_heldout_baseline_of_eval(tmp_path, monkeypatch):
    """eval.json's held-out PPL = shapley.json's all-reads-kept PPL = interventions.json's
    unmodified PPL (1e-6 relative), with the eval section taken from the pipeline config the
    run was trained from (no --config), here a window cap below the split's length."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = yaml.safe_load((ROOT / "configs/tiny.yaml").read_text())
    cfg["scales"]["tiny"]["eval"].update(heldout_windows=3, batch_size=2)  # 3 of the 5 windows, batches 2 + 1
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    pipe = load_pipeline(config_file)
    run = expand_runs(pipe, ["state_analysis"])[0]
    data_dir = tmp_path / "data" / run.scale
    write_data(data_dir, pipe.scales[run.scale].data.splits)
    run_dir = tmp_path / run.folder
    save_tiny_run(run_dir, run, data_dir, str(config_file))

    assert main(["eval", str(run_dir), "--tasks", "--no-mlflow", "--no-progress"]) == 0
    assert main(["analyze", "shapley", str(run_dir), "--no-mlflow", "--no-progress"]) == 0
    assert main(["analyze", "interventions", str(run_dir), "--no-mlflow", "--no-progress"]) == 0
    ev = json.loads((run_dir / "eval.json").read_text())["heldout"]
    sh = json.loads((run_dir / "shapley.json").read_text())
    iv = json.loads((run_dir / "interventions.json").read_text())
    assert (ev["split"], ev["windows"], ev["seq_len"], ev["tokens"]) == ("val", 3, SEQ, 3 * SEQ)
    for block in (sh["heldout"], iv["heldout"]):
        assert {k: block[k] for k in ("split", "windows", "seq_len", "tokens", "split_tokens")} == \
            {k: ev[k] for k in ("split", "windows", "seq_len", "tokens", "split_tokens")}
        assert block["ppl"] == pytest.approx(ev["ppl"], rel=1e-6) and block["nll"] == pytest.approx(ev["nll"], rel=1e-6)
    assert sh["ppl_none_masked"] == pytest.approx(ev["ppl"], rel=1e-6)
    assert iv["unmodified"]["ppl"] == pytest.approx(ev["ppl"], rel=1e-6)
    assert sh["settings"]["batch_size"] == iv["settings"]["batch_size"] == 2  # eval.batch_size
    # Calibration: a seeded sample of train window slots, disjoint from the held-out split.
    import torch

    calib = torch.load(run_dir / "interventions_calibration.pt", weights_only=False)
    starts = calib["starts"].tolist()
    assert calib["split"] == iv["calibration"]["split"] == "train" and len(starts) == TRAIN_WINDOWS  # 64 > 24 slots: all
    assert starts == [i * SEQ for i in range(TRAIN_WINDOWS)]
    assert main(["analyze", "interventions", str(run_dir), "--no-mlflow", "--no-progress", "--calib-windows", "4",
                 "--calib-seed", "3", "--max-windows", "0"]) == 0
    iv2 = json.loads((run_dir / "interventions.json").read_text())
    starts2 = torch.load(run_dir / "interventions_calibration.pt", weights_only=False)["starts"].tolist()
    assert len(starts2) == 4 == len(set(starts2)) and starts2 == sorted(starts2) and all(s % SEQ == 0 for s in starts2)
    assert starts2 != starts[:4]  # spread over the split, not its first windows
    # --max-windows 0: the whole split, no longer eval's protocol (and said so).
    assert iv2["heldout"]["windows"] == HELDOUT_WINDOWS and iv2["heldout"]["matches_eval_protocol"] is False


@pytest.mark.parametrize("data,splits", [
    ({"source": "synthetic", "synthetic": {"train_docs": 40, "val_docs": 6, "test_docs": 0}}, ("train", "val")),
    ({"source": "synthetic", "synthetic": {"train_docs": 40, "val_docs": 0, "test_docs": 6}}, ("train", "test")),
    ({"source": "LOCAL", "val_fraction": 0.3}, ("train", "val")),
    ({"source": "LOCAL", "val_fraction": 0.0, "test_fraction": 0.3}, ("train", "test")),
    ({"source": "LOCAL", "val_fraction": 0.2, "test_fraction": 0.2}, ("train", "val", "test")),
    ({"source": "LOCAL", "val_fraction": 0.0, "test_split": "HELD"}, ("train", "test")),
])
def test_produced_splits_are_the_splits_tokenize_writes(tmp_path, data, splits):
    from stateloop.config import from_dict
    from stateloop.config.data import DataConfig
    from stateloop.data.tokenize import tokenize

    texts = [f"document {i} about {i % 7} things and {i % 3} more" for i in range(200)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": "held out text"}) + "\n")
    data = {**data, "vocab_size": 300, "workers": 0, "seed": 1}
    data = {k: str(tmp_path / ("docs.jsonl" if v == "LOCAL" else "held.jsonl")) if v in ("LOCAL", "HELD") else v
            for k, v in data.items()}
    cfg = from_dict(DataConfig, data, "data")
    assert cfg.splits == splits
    meta = tokenize(cfg, tmp_path / "out", progress=False, log=lambda *a, **k: None)
    assert tuple(s for s in ("train", "val", "test") if s in meta["splits"]) == splits


def test_produced_splits_of_the_shipped_configs():
    """paper.yaml makes no test split: the analyses must not need one (the Pile's validation
    documents, val_fraction, are the held-out set)."""
    found = {}
    for path in CONFIGS:
        pipe = load_pipeline(path)
        for name, scale in pipe.scales.items():
            found[f"{path.stem}/{name}"] = scale.data.splits
            assert scale.eval.heldout_split in found[f"{path.stem}/{name}"], (path.name, name)
    if "paper/410m" in found:
        assert found["paper/410m"] == found["paper/1.4b"] == ("train", "val")


@pytest.mark.slow  # Snakemake: a summary, a touch of every output and two dry runs (about 30 s)
def test_sharding_a_finished_analysis_reruns_that_analysis_only(tmp_path):
    """The smoke DAG done (its outputs touched): asking for 3 Shapley shards plans the 3 shard
    jobs and their merge (no GPU, the merge's runtime), then the figure and the claims that read
    shapley.json; no training, evaluation or interventions. A runtime alone reruns nothing."""
    from stateloop.analysis.shards import MERGE_JOB
    from support.dag import jobs

    work = copy_workflow(tmp_path / "work")
    base = ("--configfile", "configs/smoke.yaml")
    summary = snakemake(work, "--summary", *base).stdout
    for rel in (line.split("\t")[0] for line in summary.splitlines()[1:]):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text("placeholder\n")
    snakemake(work, "--touch", "--forceall", "--cores", "1", *base)
    (work / "change.yaml").write_text(yaml.safe_dump({"scales": {"smoke": {"resources": {"analyze": {"runtime": 20}}}}}))
    assert "Nothing to be done" in snakemake(work, "-n", *base, "change.yaml").stdout
    (work / "change.yaml").write_text(yaml.safe_dump({"scales": {"smoke": {"resources": {"analyze": {"shapley_shards": 3}}}}}))
    planned = [j for j in jobs(snakemake(work, "-n", *base, "change.yaml").stdout) if j["rule"] != "all"]
    rules = sorted(j["rule"] for j in planned if not j["rule"].startswith("render"))
    assert rules == ["shapley", "shapley_shard", "shapley_shard", "shapley_shard"], planned
    shards = sorted(j["output"].rsplit("/", 1)[1] for j in planned if j["rule"] == "shapley_shard")
    assert shards == ["shapley_1of3.json", "shapley_2of3.json", "shapley_3of3.json"]
    (merge,) = [j for j in planned if j["rule"] == "shapley"]
    assert "gpu=0" in merge["resources"] and f"runtime={MERGE_JOB['runtime']}" in merge["resources"]
    renders = {j["output"].split(",")[0] for j in planned if j["rule"].startswith("render")}
    assert "figures/state_analysis.pdf" in renders and "results/claims.md" in renders and "results/table1.csv" not in renders
