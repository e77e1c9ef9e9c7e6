"""The paper's lm-eval tasks served by the stand-in hub under their real dataset names
(stateloop/ops/rehearse/tasks.py, hub.py): `stateloop prefetch` fills empty caches from it with
lm-eval's own download, and then, with the stand-in gone, the Hub switched off and every socket
refused, lm-eval's own (unchanged) task YAMLs load each dataset from the caches, as an evaluation
job on a compute node does. No training: the rehearsal of paper.yaml runs these tasks whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stateloop.config.evaluate import PAPER_TASKS

ROOT = Path(__file__).resolve().parents[2]
CLOSED = "http://127.0.0.1:9"  # a closed port
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
# The datasets lm-eval's YAMLs name for the paper's tasks: (dataset_path, dataset_name, splits).
REAL = {
    "lambada_openai": ("EleutherAI/lambada_openai", "default", {"test"}),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", {"train", "validation", "test"}),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", {"train", "validation", "test"}),
    "winogrande": ("allenai/winogrande", "winogrande_xl", {"train", "validation"}),
    "piqa": ("baber/piqa", None, {"train", "validation"}),
    "hellaswag": ("Rowan/hellaswag", None, {"train", "validation"}),
    "sciq": ("allenai/sciq", None, {"train", "validation", "test"}),
    "race": ("EleutherAI/race", "high", {"test"}),
    "wikitext": ("EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", {"train", "validation", "test"}),
}

# Run in the offline process: every socket connection and name lookup raises, then lm-eval's tasks
# are built as `stateloop eval` builds them (evaluate/tasks/prepare.py) and their data printed.
_OFFLINE_LOAD = """
import json, socket, sys
def _refuse(*args, **kwargs):
    raise AssertionError(f"network access in an offline job: {args!r}")
socket.socket.connect = socket.socket.connect_ex = _refuse
socket.getaddrinfo = _refuse
from stateloop.config.evaluate import EvalConfig
from stateloop.evaluate.tasks.prepare import prepare_tasks
tasks = sys.argv[2:]
prepared = prepare_tasks(tasks, sys.argv[1], EvalConfig(tasks=tasks))
index = prepared.task_manager.task_index
loaded = prepared.task_manager.load(tasks)["tasks"]
out = {}
for name in tasks:
    task = loaded[name]
    out[name] = {"yaml": str(index[name].yaml_path), "local": name in prepared.local,
                 "dataset": [task.config.dataset_path, task.config.dataset_name],
                 "data": {split: task.dataset[split].to_list() for split in task.dataset},
                 "eval_docs": len(task.eval_docs)}
print(json.dumps(out))
"""


def _config(path: Path) -> Path:
    """A config whose one trained run is scored on the paper's tasks; its data needs nothing from the Hub."""
    model = dict(vocab_size=320, n_layers=1, d_model=32, d_ff=64, n_heads=2, head_dim=16, max_seq_len=64)
    train = dict(accelerator="cpu", devices=1, seq_len=16, micro_batch=2, global_batch=2, max_steps=2)
    cfg = {"scales": {"t": {"model": model, "train": train, "data": {"source": "synthetic", "tokenizer": "bpe"},
                            "eval": {"tasks": list(PAPER_TASKS), "shots": [0, 5], "limit": 2}}},
           "experiments": {"table1": {"scale": "t", "models": ["vanilla_looped"], "K": [2], "d_s": [0]}}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(home: Path, **extra) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HOME": str(home),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", **extra}
    for var in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                *PROXY_VARS):
        if var not in extra:
            env.pop(var, None)
    return env


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_only_tasks_that_read_the_hub_get_a_repository(tmp_path):
    """Local tasks (workflow/tasks/, or the config's eval.task_dir) are not served; a hub task this
    module cannot make data for stops the rehearsal in one line naming it."""
    from stateloop.config import ConfigError
    from stateloop.ops.rehearse.tasks import hub_tasks, write_task_repos

    assert hub_tasks(["synth_mc", "arc_easy", "piqa_local", "arc_easy", "race"]) == ["arc_easy", "race"]
    (tmp_path / "mine.yaml").write_text("task: arc_easy\ndataset_path: json\n")
    assert hub_tasks(["arc_easy", "race"], tmp_path) == ["race"]
    with pytest.raises(ConfigError, match="no rehearsal data for lm-eval task.s. mmlu: neither a local task"):
        write_task_repos(["arc_easy", "mmlu"], tmp_path / "out", tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_every_paper_task_is_prefetched_from_the_stand_in_hub_and_resolves_offline(shared_data, tmp_path):
    import pyarrow.parquet as pq

    from stateloop.ops.rehearse.hub import Repo, serve_hub
    from stateloop.ops.rehearse.tasks import MANIFEST, write_task_repos

    for folder in ("lambada-openai", "piqa", "wikitext-2"):
        if not (shared_data / folder).is_dir():
            pytest.skip(f"{shared_data / folder} not found")
    repos = write_task_repos(PAPER_TASKS, tmp_path / "hub-tasks", shared_data)
    # one repository per dataset lm-eval's YAMLs name, under that name: ARC's two configs in one
    assert set(repos) == {path for path, _, _ in REAL.values()} and len(repos) == 8
    manifest = json.loads((tmp_path / "hub-tasks" / MANIFEST).read_text())
    for task, (path, name, splits) in REAL.items():
        assert (manifest[task]["repo"], manifest[task]["config"], set(manifest[task]["splits"])) == (
            path, name or "default", splits), task

    cfg = _config(tmp_path / "c.yaml")
    home = tmp_path / "hf"
    with serve_hub([Repo("dataset", repo_id, folder) for repo_id, folder in repos.items()]) as url:
        proc = _run(["-m", "stateloop.cli", "prefetch", "--config", cfg.name], tmp_path, _env(home, HF_ENDPOINT=url))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"lm-eval tasks {', '.join(PAPER_TASKS)}" in proc.stderr and "1 needs of c.yaml are in the caches" in proc.stderr
    for path in repos:  # each dataset came through the hub cache under its real name
        assert (home / "hub" / f"datasets--{path.replace('/', '--')}" / "snapshots").is_dir(), path

    # The stand-in is gone. Offline, as a compute node: the check finds every task's data ...
    offline = _env(home, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_ENDPOINT=CLOSED,
                   **dict.fromkeys(PROXY_VARS, CLOSED))
    proc = _run(["-m", "stateloop.cli", "prefetch", "--config", cfg.name, "--check"], tmp_path, offline)
    assert proc.returncode == 0 and "all 1 needs are in the caches" in proc.stderr, proc.stderr[-3000:]
    # ... and lm-eval's own task definitions load exactly the served records, with no socket opened.
    proc = _run(["-c", _OFFLINE_LOAD, str(tmp_path / "work"), *PAPER_TASKS], tmp_path, offline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    import lm_eval

    installed = Path(lm_eval.__file__).resolve().parent / "tasks"
    for task, (path, name, splits) in REAL.items():
        got = loaded[task]
        assert not got["local"] and installed in Path(got["yaml"]).resolve().parents, got["yaml"]  # lm-eval's own YAML
        assert got["dataset"] == [path, name] and set(got["data"]) == splits, task
        for split, rows in got["data"].items():
            served = pq.read_table(repos[path] / manifest[task]["splits"][split]["file"]).to_pylist()
            assert rows == served and len(rows) == 20, (task, split)
        assert got["eval_docs"] == 20, task
    # the shared data came through as it is: LAMBADA's first lines, PIQA's dev set
    lambada = (shared_data / "lambada-openai" / "lambada_test.jsonl").read_text().splitlines()[:20]
    assert loaded["lambada_openai"]["data"]["test"] == [json.loads(line) for line in lambada]
    assert loaded["piqa"]["data"]["validation"][0]["goal"] == json.loads(
        (shared_data / "piqa" / "valid.jsonl").read_text().splitlines()[0])["goal"]

    # A task's data gone from the caches: the check names it with its real dataset and config.
    import shutil

    shutil.rmtree(home / "datasets")
    proc = _run(["-m", "stateloop.cli", "prefetch", "--config", cfg.name, "--check"], tmp_path, offline)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "arc_challenge (allenai/ai2_arc, ARC-Challenge)" in proc.stderr and "hellaswag (Rowan/hellaswag)" in proc.stderr
