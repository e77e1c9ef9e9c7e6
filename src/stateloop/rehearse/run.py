"""Prepare a rehearsal folder and run the config's DAG in it.

A rehearsal folder ``OUT`` holds

    config.yaml      the shrunk config (rehearse/config.py) pointing at the local copies below
    hub-data/        each hub dataset of the config as a local folder in its hub layout (mirrors.py)
    hf-cache/        the config's hub tokenizer in huggingface_hub's cache layout, so that the
                     tokenizer loads by its hub name (``Tokenizer.from_pretrained``) offline
    tasks/           the config's lm-eval tasks over local data files (evaluate/tasks/rehearsal.py)
    bin/srun         the local stand-in for SLURM's srun (srun.py)

and, once the DAG ran, its ``data/``, ``results/``, ``figures/`` and ``logs/``: Snakemake runs
the repository's own Snakefile with ``--directory OUT``, so nothing of a real run is touched.
The jobs see ``PATH=OUT/bin:$PATH``, ``HF_HUB_CACHE=OUT/hf-cache`` and offline switches for
huggingface_hub and datasets (nothing is downloaded; a missing local copy fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from stateloop.config import ConfigError, from_dict, load_yaml
from stateloop.data.config import DataConfig, is_local_source
from stateloop.data.tokenizer import is_local_tokenizer
from stateloop.evaluate.config import EvalConfig
from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, REPO, default_shared_data, task_yamls
from stateloop.evaluate.tasks.rehearsal import write_tasks
from stateloop.pipeline import pipeline_from_dict
from stateloop.rehearse.config import shrink
from stateloop.rehearse.mirrors import write_mirror
from stateloop.runs import atomic_write_bytes

SNAKEFILE = REPO / "Snakefile"
# hub tokenizer name -> its file under the shared data folder
TOKENIZERS = {"EleutherAI/gpt-neox-20b": "gpt-neox-20b/tokenizer.json"}
CACHE_REVISION = "0" * 40  # the snapshot name of the local hub cache (any 40-hex string)


def _is_hub_source(value) -> bool:
    """A data source the tokenize stage reads from the hub (not synthetic, not local files)."""
    return isinstance(value, str) and value != "synthetic" and not is_local_source(value)


def hub_cache(tokenizer: str, out: Path, shared_data: Path) -> Path:
    """``out`` in huggingface_hub's cache layout holding ``tokenizer``'s tokenizer.json."""
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"data.tokenizer: {tokenizer!r} has no local copy for a rehearsal "
                          f"(known: {', '.join(TOKENIZERS)}); set a local tokenizer.json")
    source = shared_data / TOKENIZERS[tokenizer]
    if not source.is_file():
        raise FileNotFoundError(f"{source}: the local copy of {tokenizer} is missing (shared data)")
    repo = out / ("models--" + tokenizer.replace("/", "--"))
    snapshot = repo / "snapshots" / CACHE_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(CACHE_REVISION)
    target = snapshot / "tokenizer.json"
    if not target.exists() or target.stat().st_size != source.stat().st_size:
        target.write_bytes(source.read_bytes())
    return out


def prepare(config: str | Path, out: str | Path, shared_data: str | Path | None = None) -> Path:
    """Write the rehearsal folder of ``config`` (see the module docstring); returns its config."""
    out = Path(out).resolve()
    shared = Path(shared_data) if shared_data else default_shared_data()
    raw = load_yaml(config)
    pipeline_from_dict(raw, str(config))  # the real config must be valid before it is rehearsed
    cfg = shrink(raw)
    local_tasks = set(task_yamls(DEFAULT_TASK_DIR))
    written_tasks: dict[tuple, dict] = {}
    for name, scale in cfg["scales"].items():
        data = scale["data"]
        if _is_hub_source(data.get("source")):
            data.update(write_mirror(from_dict(DataConfig, data, f"scales.{name}.data"), out / "hub-data", shared))
        elif data.get("source", "synthetic") != "synthetic":  # local files: relative to where the config is run
            sources = data["source"] if isinstance(data["source"], list) else [data["source"]]
            absolute = [str(Path(src).resolve()) for src in sources]
            data["source"] = absolute if isinstance(data["source"], list) else absolute[0]
            data.setdefault("max_docs", 400)
        tok = data.get("tokenizer", "bpe")
        if tok != "bpe" and not is_local_tokenizer(tok):
            hub_cache(tok, out / "hf-cache", shared)
        names = from_dict(EvalConfig, scale["eval"], f"scales.{name}.eval").tasks
        hub_tasks = tuple(t for t in names if t not in local_tasks)
        if hub_tasks:
            if hub_tasks not in written_tasks:
                written_tasks[hub_tasks] = write_tasks(list(hub_tasks), out / "tasks", shared)
            scale["eval"].update(written_tasks[hub_tasks])
    pipeline_from_dict(cfg, str(out / "config.yaml"))
    header = (f"# Rehearsal of {config}: the same DAG with sizes shrunk (stateloop rehearse).\n"
              f"# Written by stateloop.rehearse; edit the real config and rehearse again instead.\n")
    atomic_write_bytes(out / "config.yaml", (header + yaml.safe_dump(cfg, sort_keys=False)).encode())
    srun = out / "bin" / "srun"
    srun.parent.mkdir(parents=True, exist_ok=True)
    srun.write_text(f"#!/bin/sh\n# local stand-in for SLURM's srun (stateloop.rehearse.srun)\n"
                    f"exec {sys.executable} -m stateloop.rehearse.srun \"$@\"\n")
    srun.chmod(0o755)
    return out / "config.yaml"


def environment(out: str | Path) -> dict:
    """The environment the rehearsal's jobs run in."""
    out = Path(out).resolve()
    env = dict(os.environ)
    # bin/srun first; then this Python's scripts (stateloop, snakemake), as in an activated venv
    path = os.pathsep.join([str(out / "bin"), str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(PATH=path, HF_HUB_CACHE=str(out / "hf-cache"),
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               MLFLOW_TRACKING_URI=f"sqlite:///{out / 'results' / 'mlflow.db'}")
    return env


def snakemake_command(out: str | Path, cores: int, extra: list[str]) -> list[str]:
    out = Path(out).resolve()
    # Targets go before --configfile, which takes every following word as a file.
    return [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(out), "--cores", str(cores),
            "--rerun-incomplete", *extra, "--configfile", str(out / "config.yaml")]


def run_dag(out: str | Path, cores: int = 2, extra: list[str] | None = None, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(snakemake_command(out, cores, extra or []), env=environment(out), **popen)
