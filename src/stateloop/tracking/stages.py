"""The stages after training (eval, the analyses): the MLflow store they log to (:func:`stage_uri`,
chosen from the command line's pipeline config, never from a run folder), the MLflow run of a run
folder (:func:`run_of`: the one its train.json names, else one named by the run id), and one
stage's results logged into it (:func:`log_stage`)."""

from __future__ import annotations

from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.pipeline import PipelineConfig
from stateloop.config.run import RunConfig
from stateloop.runs import TRAIN_SUMMARY
from stateloop.tracking.records import log_datasets, log_params, standard_tags
from stateloop.tracking.store import client, named_run, same_store, tracking_uri

DEFAULT_EXPERIMENT = "stateloop"  # train.mlflow_experiment's default


def train_summary(run_dir) -> dict:
    """RUN_DIR/train.json (written when training finishes), or {} when absent."""
    import json

    path = Path(run_dir) / TRAIN_SUMMARY
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise ConfigError(f"{path}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def stage_uri(config: RunConfig | None, pipeline: PipelineConfig | None = None) -> str:
    """The store of a stage after training: $MLFLOW_TRACKING_URI, else the ``train.mlflow_tracking_uri``
    of the run's scale in the pipeline config named on the command line, else the local default.
    Never the store that train.json, the run's saved config or the config file it names gives."""
    scale = pipeline.scales.get(config.run.scale if config else None) if pipeline is not None else None
    return tracking_uri(scale.train.mlflow_tracking_uri if scale is not None else None)


def run_of(run_dir, run_id: str, config: RunConfig | None, pipeline: PipelineConfig | None = None, command: str = "eval"):
    """(client, MLflow run id) of a run folder in :func:`stage_uri`'s store: the run train.json
    names when the store holds it (missing from the store train.json records: an error), else the
    newest run named ``run_id`` in the run's experiment, created when absent."""
    from mlflow.exceptions import MlflowException

    summary = train_summary(run_dir)
    uri = stage_uri(config, pipeline)
    c = client(uri)
    mlflow_id, recorded = summary.get("mlflow_run_id"), summary.get("mlflow_tracking_uri")
    if mlflow_id:
        try:
            c.get_run(mlflow_id)
            return c, mlflow_id
        except MlflowException:
            if not recorded or same_store(recorded, uri):
                raise ConfigError(f"{Path(run_dir) / TRAIN_SUMMARY}: mlflow_run_id {mlflow_id} is not in the MLflow store {uri}") from None
    experiment = (config.train.mlflow_experiment if config and config.train else "") or DEFAULT_EXPERIMENT
    tags = {"run_id": run_id, **standard_tags(command)}
    return c, named_run(c, experiment, f"attributes.run_name = '{run_id}'", run_id, tags)


def log_stage(run_dir, run_id: str, config: RunConfig | None, pipeline: PipelineConfig | None, command: str, prefix: str,
              metrics: dict, curves: dict | None = None, params: dict | None = None, tags: dict | None = None,
              artifact: tuple | None = None, datasets: dict | None = None) -> str:
    """Log one stage's results into the run's MLflow run (:func:`run_of`) and return its id:
    ``metrics`` as ``{prefix}/<name>`` at step 0, each curve ``{name: [(index, value), ...]}`` stepped
    by its index, ``params`` (changed values go to ``changed_on_re{command}.<key>`` tags: MLflow
    params cannot change), ``tags``, ``artifact`` = (file or dict, artifact path), ``datasets``."""
    import datetime

    from mlflow.entities import Metric, RunTag

    c, mlflow_id = run_of(run_dir, run_id, config, pipeline, command=command)
    if params:
        log_params(c, mlflow_id, params, f"changed_on_re{command}.")
    now = int(datetime.datetime.now().timestamp() * 1000)
    points = [Metric(f"{prefix}/{k}", float(v), now, 0) for k, v in metrics.items()]
    points += [Metric(f"{prefix}/{k}", float(v), now, int(i)) for k, curve in (curves or {}).items() for i, v in curve]
    run_tags = [RunTag(k, str(v)) for k, v in (tags or {}).items()]
    for start in range(0, max(len(points), 1), 500):
        c.log_batch(mlflow_id, metrics=points[start : start + 500], tags=run_tags if start == 0 else [])
    if datasets:
        log_datasets(c, mlflow_id, run_id.split("/")[0], datasets)
    if artifact is not None:
        content, where = artifact
        if isinstance(content, dict):
            c.log_dict(mlflow_id, content, where)
        else:
            c.log_artifact(mlflow_id, str(content), artifact_path=where)
    return mlflow_id
