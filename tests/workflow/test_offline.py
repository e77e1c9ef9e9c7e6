"""Jobs without network: configs/paper.yaml's rehearsal starts with empty Hugging Face caches, fills
them with `stateloop prefetch` from the stand-in hub (rehearse/hub.py), which then stops, and runs
its jobs with the Hub switched off and no network (rehearse/run.py); the SLURM rule jobs of the
DAG switch the Hub off themselves; a job that lacks a file stops at its start, in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from support.rehearsals import SHARED, dag

pytestmark = pytest.mark.slow

RUN = "1.4b/vanilla_looped/K4_ds0_seed1234"


def _last_line(path) -> str:
    return (path.read_text().strip().splitlines() or [""])[-1]


def test_the_paper_rehearsal_prefetches_into_empty_caches_then_runs_offline(tmp_path):
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} not found: rehearsing paper.yaml needs the local data copies")
    from stateloop.ops.rehearse.run import HF_HOME, environment, prepare, snakemake_command
    from support.dag import ROOT

    out = tmp_path / "paper"
    prepare(ROOT / "configs/paper.yaml", out)
    log = (out / "prefetch.log").read_text()
    # everything downloaded (the caches were empty): the tokenizer, 32 files of the Pile's layout, the tasks' datasets
    assert "monology/pile-uncopyrighted: 32 files (README.md, train/*.jsonl.zst, val.jsonl.zst), 31 to download" in log, log
    assert "tokenizer EleutherAI/gpt-neox-20b:" in log and "3 needs of" in log, log
    cfg = (out / "config.yaml").read_text()
    assert "source: monology/pile-uncopyrighted" in cfg and "tokenizer: EleutherAI/gpt-neox-20b" in cfg  # hub names, read offline
    # the tasks' datasets came from the stand-in into the hub cache under lm-eval's names; no task YAML rewritten
    assert "task_dir" not in cfg and not (out / "tasks").exists()
    for repo in ("EleutherAI--lambada_openai", "allenai--ai2_arc", "allenai--winogrande", "baber--piqa", "Rowan--hellaswag",
                 "allenai--sciq", "EleutherAI--race", "EleutherAI--wikitext_document_level"):
        assert (out / HF_HOME / "hub" / f"datasets--{repo}" / "snapshots").is_dir(), repo

    env = environment(out)
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1" and env["HF_HOME"] == str(out / HF_HOME)
    # no network for the jobs: the Hub's endpoint and any proxied request go to a closed port
    probe = subprocess.run([sys.executable, "-c", "import urllib.request; urllib.request.urlopen('http://example.com', timeout=20)"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "Connection refused" in probe.stderr, probe.stderr[-500:]

    proc = dag(out, f"results/runs/{RUN}/eval.json")  # tokenize, a 2-"node" training under srun, its lm-eval tasks
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = json.loads((out / "data/1.4b/meta.json").read_text())
    assert meta["source"]["kind"] == "hub" and meta["source"]["name"] == "monology/pile-uncopyrighted"
    tasks = json.loads((out / "results/runs" / RUN / "eval.json").read_text())["tasks"]
    assert len(tasks) == 9 and all(entry["source"] == "lm-eval" for entry in tasks.values()), tasks  # lm-eval's own YAMLs

    # A file missing from the cache: the 410M tokenize job stops at its start, its log's one line naming it.
    snapshot = next((out / HF_HOME / "hub/datasets--monology--pile-uncopyrighted/snapshots").iterdir())
    (snapshot / "val.jsonl.zst").unlink()
    proc = dag(out, "data/410m/meta.json")
    assert proc.returncode != 0
    line = _last_line(out / "logs/tokenize/410m.log")
    assert line.startswith("stateloop tokenize: error: offline (HF_HUB_OFFLINE=1), and not in the caches"), line
    assert "dataset monology/pile-uncopyrighted: 1 of 32 files missing (val.jsonl.zst)" in line, line
    assert "run `stateloop prefetch --config results/configs/" in line, line

    # A rule job inside a SLURM job switches the Hub off itself (the submitting shell did not).
    shutil.rmtree(out / HF_HOME / "hub" / "models--EleutherAI--gpt-neox-20b")
    online = {k: v for k, v in env.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = subprocess.run(snakemake_command(out, 1, ["--mode", "remote", "data/410m/meta.json"]), capture_output=True,
                          env={**online, "SLURM_JOB_ID": "91", "SLURM_CPUS_ON_NODE": "1"}, text=True, timeout=600)
    assert proc.returncode != 0
    line = _last_line(out / "logs/tokenize/410m.log")
    assert line.startswith("stateloop tokenize: error: offline (HF_HUB_OFFLINE=1)"), line
    assert "tokenizer EleutherAI/gpt-neox-20b (tokenizer.json)" in line, line
