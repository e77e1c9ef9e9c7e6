"""The MLflow store every stage logs to, and a client that is safe to open from parallel jobs.

Store: ``$MLFLOW_TRACKING_URI``, else the first configured URI given (the store a run's training
logged to, the config's ``train.mlflow_tracking_uri``), else ``sqlite:///<cwd>/results/mlflow.db``
(MLflow 3 refuses the old ``./mlruns`` file store). On a cluster, point MLFLOW_TRACKING_URI at a
tracking server rather than at one sqlite file shared over NFS.

A new sqlite store is created (schema migrations) by the first client that opens it; two jobs
doing that at once collide (``table _alembic_tmp_experiments already exists``), so opening a
sqlite store is serialised with a lock file beside it.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from stateloop.runs import TRAIN_SUMMARY

DEFAULT_DB = Path("results") / "mlflow.db"


def tracking_uri(*configured: str | None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or next((u for u in configured if u), "")
    if not uri:
        uri = f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    return uri


@contextmanager
def _store_lock(uri: str):
    if not uri.startswith("sqlite:///"):
        yield
        return
    lock = Path(uri[len("sqlite:///"):] + ".lock")
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def client(uri: str):
    """An MlflowClient on ``uri`` whose store exists and is fully migrated."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)  # creates / migrates the store now, under the lock
    return c


DEFAULT_EXPERIMENT = "stateloop"  # train.mlflow_experiment's default


def experiment_id(c, name: str) -> str:
    """The id of the MLflow experiment ``name``, created when absent."""
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp is not None else c.create_experiment(name)


def train_summary(run_dir) -> dict:
    """RUN_DIR/train.json (written when training finishes), or {} when absent."""
    import json

    from stateloop.config import ConfigError

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


def run_of(run_dir, run_id: str, config: dict | None):
    """(client, MLflow run id) of a run folder, for the stages after training.

    The MLflow run is the one RUN_DIR/train.json names (``mlflow_run_id``), which must exist in the
    store; without it (a run trained elsewhere), the run named ``run_id`` in the config's
    ``train.mlflow_experiment``, created when absent and found again next time."""
    from mlflow.exceptions import MlflowException

    from stateloop.config import ConfigError

    summary = train_summary(run_dir)
    train = (config or {}).get("train") if isinstance((config or {}).get("train"), dict) else {}
    uri = tracking_uri(summary.get("mlflow_tracking_uri"), train.get("mlflow_tracking_uri"))
    c = client(uri)
    mlflow_id = summary.get("mlflow_run_id")
    if mlflow_id:
        try:
            c.get_run(mlflow_id)
        except MlflowException:
            raise ConfigError(f"{Path(run_dir) / TRAIN_SUMMARY}: mlflow_run_id {mlflow_id} is not in the MLflow store {uri}") from None
        return c, mlflow_id
    exp_id = experiment_id(c, train.get("mlflow_experiment") or DEFAULT_EXPERIMENT)
    found = c.search_runs([exp_id], filter_string=f"attributes.run_name = '{run_id}'", max_results=1)
    mlflow_id = found[0].info.run_id if found else c.create_run(exp_id, run_name=run_id, tags={"run_id": run_id}).info.run_id
    return c, mlflow_id
