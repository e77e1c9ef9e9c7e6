"""What the analyses of a trained run share: the run's model and held-out windows, and logging
the results to MLflow next to the run's training record."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from stateloop.config import ConfigError

DEFAULT_TRACKING_URI = "sqlite:///results/mlflow.db"


def pick_device(name: str = "auto") -> torch.device:
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def run_seq_len(config: dict, model) -> int:
    """The training context length of a run: ``train.seq_len`` of its config when present,
    else the model's ``max_seq_len``."""
    train = config.get("train") or {}
    return int(train.get("seq_len") or model.cfg.max_seq_len)


def run_windows(config: dict, run_dir, split: str, seq_len: int, max_windows: int | None) -> torch.Tensor:
    """Held-out windows (N, seq_len + 1) of the run's token shards (``data.dir`` of its config)."""
    from stateloop.data.shards import ShardSet
    from stateloop.evaluate.perplexity import heldout_windows

    data = config.get("data") or {}
    if not data.get("dir"):
        raise ConfigError(f"{Path(run_dir) / 'config'}: data.dir is not set, so the run's token shards are unknown")
    try:
        shards = ShardSet(data["dir"], split)
    except KeyError as err:
        raise ConfigError(err.args[0]) from None
    try:
        return heldout_windows(shards, seq_len, max_windows)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def require_reads(model, what: str) -> None:
    """The analyses of Sec. 5 need a StateLoop model with state reads."""
    from stateloop.models.looped import StateLoopLM

    if not isinstance(model, StateLoopLM):
        raise ConfigError(f"model.name: {what} needs a model with a persistent state; {model.cfg.name} has none")
    if not model.has_reads:
        raise ConfigError(f"model.name: {what} needs state reads; {model.cfg.name} has none")


def training_mlflow_run_id(run_dir) -> str | None:
    """The MLflow run id training recorded in RUN_DIR/train.json, if any."""
    path = Path(run_dir) / "train.json"
    if not path.is_file():
        return None
    try:
        with open(path) as fh:
            return json.load(fh).get("mlflow_run_id")
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None


def log_to_mlflow(run_dir, analysis: str, metrics: dict, tags: dict, json_path) -> str:
    """Log an analysis to MLflow: metrics prefixed ``{analysis}/``, tags, the JSON as an artifact.

    Tracking URI: $MLFLOW_TRACKING_URI, else sqlite:///results/mlflow.db (relative to the working
    directory). The analysis attaches to the run's training MLflow run (``mlflow_run_id`` in
    RUN_DIR/train.json) when there is one and the tracking store knows it; otherwise it opens a
    run of its own in the experiment ``stateloop-analysis``, named after the run folder.
    Tags rather than params carry settings, because params of a finished run cannot change when
    an analysis is re-run with other settings. Returns the MLflow run id logged to.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    run_id = training_mlflow_run_id(run_dir)
    if run_id is not None:
        try:
            mlflow.get_run(run_id)
        except MlflowException:
            print(f"warning: MLflow run {run_id} of {run_dir}/train.json is not in {uri}; logging to a new run",
                  file=sys.stderr)
            tags = {**tags, "train_mlflow_run_id": run_id}
            run_id = None
    if run_id is None:
        mlflow.set_experiment("stateloop-analysis")
        ctx = mlflow.start_run(run_name=f"{run_label(run_dir)}/{analysis}")
    else:
        ctx = mlflow.start_run(run_id=run_id)
    with ctx as active:
        mlflow.log_metrics({f"{analysis}/{k}": float(v) for k, v in metrics.items()})
        mlflow.set_tags({f"{analysis}.{k}": str(v) for k, v in tags.items()})
        mlflow.log_artifact(str(json_path), artifact_path="analysis")
        return active.info.run_id


def run_label(run_dir) -> str:
    """``scale/model/K.._ds..`` for a folder under results/runs, else the folder's name."""
    parts = Path(run_dir).resolve().parts
    if "runs" in parts:
        i = len(parts) - 1 - parts[::-1].index("runs")
        if len(parts) - i - 1 == 3:
            return "/".join(parts[i + 1:])
    return Path(run_dir).name
