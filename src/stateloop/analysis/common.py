"""What the analyses of a trained run share: the run's model and held-out windows, and logging
the results to MLflow next to the run's training record."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from stateloop.config import ConfigError

DEFAULT_EXPERIMENT = "stateloop"  # training's default train.mlflow_experiment


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
        raise ConfigError(f"{Path(run_dir) / 'model.pt'}: the saved config has no data.dir, so the run's token shards are unknown")
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


def train_summary(run_dir) -> dict:
    """RUN_DIR/train.json (written by training), or {} when absent."""
    path = Path(run_dir) / "train.json"
    if not path.is_file():
        return {}
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot be read ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def run_id_of(run_dir, config: dict) -> str:
    """The run id ``{scale}/{model}/K{K}_ds{ds}``: the config's ``run.id`` when set, else the
    folder's last three path components (results/runs/<id>)."""
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    return str(run["id"]) if run.get("id") else "/".join(Path(run_dir).resolve().parts[-3:])


def tracking_uri(summary: dict, config: dict) -> str:
    """The store training logged to (train.json, then the config's train.mlflow_tracking_uri)."""
    from stateloop.tracking import tracking_uri as resolve

    train = config.get("train") if isinstance(config.get("train"), dict) else {}
    return resolve(summary.get("mlflow_tracking_uri"), train.get("mlflow_tracking_uri"))


def log_to_mlflow(run_dir, config: dict, analysis: str, metrics: dict, tags: dict, json_path) -> str:
    """Log an analysis into the run's MLflow run: metrics as ``{analysis}/<name>``, settings as
    ``{analysis}.<name>`` tags (tags, unlike params, may change when an analysis is re-run with
    other settings), and the JSON as an artifact under ``analysis/``. Returns the MLflow run id.

    The MLflow run is the one RUN_DIR/train.json names (``mlflow_run_id``), which must exist in the
    store; without it, the run named by the run id in the config's ``train.mlflow_experiment``
    (default "stateloop"), created when absent and found again next time. The client API is used
    so that no global active run leaks between calls.
    """
    import datetime

    from mlflow.entities import Metric, RunTag
    from mlflow.exceptions import MlflowException
    from stateloop.tracking import client as open_client

    summary = train_summary(run_dir)
    uri = tracking_uri(summary, config)
    client = open_client(uri)
    mlflow_id = summary.get("mlflow_run_id")
    if mlflow_id:
        try:
            client.get_run(mlflow_id)
        except MlflowException:
            raise ConfigError(f"{Path(run_dir) / 'train.json'}: mlflow_run_id {mlflow_id} is not in the MLflow store {uri}") from None
    else:
        train = config.get("train") if isinstance(config.get("train"), dict) else {}
        name = train.get("mlflow_experiment") or DEFAULT_EXPERIMENT
        run_id = run_id_of(run_dir, config)
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        found = client.search_runs([exp_id], filter_string=f"attributes.run_name = '{run_id}'", max_results=1)
        mlflow_id = found[0].info.run_id if found else client.create_run(exp_id, run_name=run_id, tags={"run_id": run_id}).info.run_id
    now = int(datetime.datetime.now().timestamp() * 1000)
    client.log_batch(
        mlflow_id,
        metrics=[Metric(f"{analysis}/{k}", float(v), now, 0) for k, v in metrics.items()],
        tags=[RunTag(f"{analysis}.{k}", str(v)) for k, v in tags.items()],
    )
    client.log_artifact(mlflow_id, str(json_path), artifact_path="analysis")
    return mlflow_id
