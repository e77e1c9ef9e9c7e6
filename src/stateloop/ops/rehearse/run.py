"""Prepare a rehearsal folder and run the config's DAG in it.

``OUT`` holds ``config.yaml`` (rehearse/config.py), ``hub-data/`` (mirrors.py), ``hub-models/`` (the
tokenizer), ``hub-tasks/`` (tasks.py), ``hf-home/`` (the caches, empty until the prefetch) and
``bin/srun`` (srun.py); Snakemake runs the repository's Snakefile with ``--directory OUT``, so
nothing of a real run is touched. :func:`prepare` ends with ``stateloop prefetch`` against the
stand-in Hub (hub.py), then stops it; the jobs see ``PATH=OUT/bin:$PATH``, ``HF_HOME=OUT/hf-home``,
the offline switches and no network (the endpoint and proxies at a closed port), so a job that
needs a file the prefetch did not fetch fails at its start, naming it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from stateloop.config import ConfigError, from_dict, read_config
from stateloop.config.data import DataConfig, is_local_source
from stateloop.config.evaluate import EvalConfig
from stateloop.data.tokenizer import is_local_tokenizer
from stateloop.evaluate.tasks.files import REPO, default_shared_data
from stateloop.experiments import checked_pipeline, pipeline_from_dict
from stateloop.files import atomic_write_bytes
from stateloop.ops.cluster import check_cluster
from stateloop.ops.memory import gate
from stateloop.ops.rehearse.config import shrink
from stateloop.ops.rehearse.hub import Repo, serve_hub
from stateloop.ops.rehearse.mirrors import write_mirror
from stateloop.ops.rehearse.tasks import hub_tasks, write_task_repos

SNAKEFILE = REPO / "Snakefile"
# hub tokenizer name -> its file under the shared data folder
TOKENIZERS = {"EleutherAI/gpt-neox-20b": "gpt-neox-20b/tokenizer.json"}
HF_HOME = "hf-home"
NO_NETWORK = "http://127.0.0.1:9"  # a closed port: the Hub's endpoint and the proxies of the offline jobs
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def _is_hub_source(value) -> bool:
    """A data source the tokenize stage reads from the hub (not synthetic, not local files)."""
    return isinstance(value, str) and value != "synthetic" and not is_local_source(value)


def tokenizer_repo(tokenizer: str, out: Path, shared_data: Path) -> Path:
    """A folder holding ``tokenizer``'s tokenizer.json, served as its hub repository."""
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"data.tokenizer: {tokenizer!r} has no local copy for a rehearsal "
                          f"(known: {', '.join(TOKENIZERS)}); set a local tokenizer.json")
    source = shared_data / TOKENIZERS[tokenizer]
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the local copy of {tokenizer} is missing (shared data)")
    folder = out / tokenizer.replace("/", "--")
    target = folder / "tokenizer.json"
    if not target.is_file() or target.read_bytes() != source.read_bytes():
        atomic_write_bytes(target, source.read_bytes())
    return folder


def prepare(config: str | Path, out: str | Path, shared_data: str | Path | None = None) -> Path:
    """Write the rehearsal folder of ``config`` (see the module docstring); returns its config."""
    out = Path(out).resolve()
    shared = Path(shared_data) if shared_data else default_shared_data()
    raw = read_config(config)  # with the file its `base:` names merged under it
    # the real config must be valid before it is rehearsed; lm-eval tasks' data is served for the scales
    # whose runs are trained (and so evaluated), as `stateloop prefetch` fetches them: Table 3's
    # untrained shapes have a scale of their own whose tasks no job reads
    real, runs = checked_pipeline(raw, str(config))
    check_cluster(real, str(config))
    gate(real, runs, str(config))
    trained = {run.scale for run in runs.values()}
    cfg = shrink(raw)
    tasks: list[str] = []  # the lm-eval tasks whose data the stand-in hub serves
    repos: dict[tuple[str, str], Path] = {}  # what the stand-in hub serves
    for name, scale in cfg["scales"].items():
        data = scale["data"]
        if _is_hub_source(data.get("source")):
            mirror = Path(write_mirror(from_dict(DataConfig, data, f"scales.{name}.data"), out / "hub-data", shared)["source"])
            if repos.setdefault(("dataset", data["source"]), mirror) != mirror:
                data["source"] = str(mirror)  # another scale's mirror of the same name is served: read this one as a folder
        elif data.get("source", "synthetic") != "synthetic":  # local files: relative to where the config is run
            sources = data["source"] if isinstance(data["source"], list) else [data["source"]]
            absolute = [str(Path(src).resolve()) for src in sources]
            data["source"] = absolute if isinstance(data["source"], list) else absolute[0]
            data.setdefault("max_docs", 400)
        tok = data.get("tokenizer", "bpe")
        if tok != "bpe" and not is_local_tokenizer(tok):
            repos[("model", tok)] = tokenizer_repo(tok, out / "hub-models", shared)
        if name in trained:
            ev = from_dict(EvalConfig, scale["eval"], f"scales.{name}.eval")
            tasks += hub_tasks(ev.tasks, ev.task_dir)
    for repo_id, folder in (write_task_repos(tasks, out / "hub-tasks", shared) if tasks else {}).items():
        if repos.setdefault(("dataset", repo_id), folder) != folder:
            raise ConfigError(f"{repo_id}: both a data source and the dataset of an lm-eval task; a rehearsal serves one")
    pipeline_from_dict(cfg, str(out / "config.yaml"))
    header = (f"# Rehearsal of {config}: the same DAG with sizes shrunk (stateloop rehearse).\n"
              f"# Written by stateloop.ops.rehearse; edit the real config and rehearse again instead.\n")
    atomic_write_bytes(out / "config.yaml", (header + yaml.safe_dump(cfg, sort_keys=False)).encode())
    srun = out / "bin" / "srun"
    srun.parent.mkdir(parents=True, exist_ok=True)
    srun.write_text(f"#!/bin/sh\n# local stand-in for SLURM's srun (stateloop.ops.rehearse.srun)\n"
                    f"exec {sys.executable} -m stateloop.ops.rehearse.srun \"$@\"\n")
    srun.chmod(0o755)
    prefetch(out, repos)
    return out / "config.yaml"


def prefetch(out: Path, repos: dict[tuple[str, str], Path]) -> None:
    """``stateloop prefetch --config OUT/config.yaml`` against the stand-in hub serving ``repos``,
    into ``OUT/hf-home``; the stand-in stops after it. One line on failure."""
    with serve_hub([Repo(kind, name, folder) for (kind, name), folder in repos.items()]) as url:
        env = {k: v for k, v in environment(out).items() if k not in OFFLINE_VARS + PROXY_VARS}
        env.update(HF_ENDPOINT=url, HF_HUB_DISABLE_PROGRESS_BARS="1")
        proc = subprocess.run([sys.executable, "-m", "stateloop.cli", "prefetch", "--config", str(out / "config.yaml")],
                              env=env, capture_output=True, text=True)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("stateloop prefetch")]
    if proc.returncode != 0:
        raise ConfigError(f"the rehearsal's prefetch failed ({proc.returncode}): "
                          f"{(lines or proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    (out / "prefetch.log").write_text(proc.stderr)


def environment(out: str | Path) -> dict:
    """The environment the rehearsal's jobs run in."""
    out = Path(out).resolve()
    env = dict(os.environ)
    # bin/srun first; then this Python's scripts (stateloop, snakemake), as in an activated venv
    path = os.pathsep.join([str(out / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    home = out / HF_HOME
    env.update(PATH=path, HF_HOME=str(home), HF_HUB_CACHE=str(home / "hub"), HF_DATASETS_CACHE=str(home / "datasets"),
               HF_ENDPOINT=NO_NETWORK, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
               MLFLOW_TRACKING_URI=f"sqlite:///{out / 'results' / 'mlflow.db'}")
    env.update(dict.fromkeys(OFFLINE_VARS, "1"))
    env.update(dict.fromkeys(PROXY_VARS, NO_NETWORK))
    return env


def snakemake_command(out: str | Path, cores: int, extra: list[str]) -> list[str]:
    out = Path(out).resolve()
    # Targets go before --configfile, which takes every following word as a file.
    return [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(out), "--cores", str(cores),
            "--rerun-incomplete", *extra, "--configfile", str(out / "config.yaml")]


def run_dag(out: str | Path, cores: int = 2, extra: list[str] | None = None, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_command(out, cores, extra or []), env=environment(out), **popen)
