"""What the analyses of a trained run share: the run's model and held-out windows, and logging
the results to MLflow next to the run's training record."""

from __future__ import annotations

from pathlib import Path

import torch

from stateloop.config import ConfigError

def run_seq_len(config: dict, model) -> int:
    """The training context length of a run: ``train.seq_len`` of its config when present,
    else the model's ``max_seq_len``."""
    from stateloop.runs import trained_length

    return int(trained_length(config) or model.cfg.max_seq_len)


def run_windows(config: dict, run_dir, split: str, seq_len: int, max_windows: int | None) -> torch.Tensor:
    """Held-out windows (N, seq_len + 1) of the run's token shards (``data.dir`` of its config)."""
    from stateloop.evaluate.perplexity import split_windows

    data = config.get("data") or {}
    if not data.get("dir"):
        raise ConfigError(f"{Path(run_dir) / 'model.pt'}: the saved config has no data.dir, so the run's token shards are unknown")
    return split_windows(data["dir"], split, seq_len, max_windows)[0]


def require_reads(model, what: str) -> None:
    """The analyses of Sec. 5 need a StateLoop model with state reads."""
    from stateloop.models.looped import StateLoopLM

    if not isinstance(model, StateLoopLM):
        raise ConfigError(f"model.name: {what} needs a model with a persistent state; {model.cfg.name} has none")
    if not model.has_reads:
        raise ConfigError(f"model.name: {what} needs state reads; {model.cfg.name} has none")


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

    from stateloop.tracking import run_of

    from stateloop.runs import run_id_of

    client, mlflow_id = run_of(run_dir, run_id_of(run_dir, config), config)
    now = int(datetime.datetime.now().timestamp() * 1000)
    client.log_batch(
        mlflow_id,
        metrics=[Metric(f"{analysis}/{k}", float(v), now, 0) for k, v in metrics.items()],
        tags=[RunTag(f"{analysis}.{k}", str(v)) for k, v in tags.items()],
    )
    client.log_artifact(mlflow_id, str(json_path), artifact_path="analysis")
    return mlflow_id
