"""The MLflow store every stage logs to, and a client that is safe to open from parallel jobs.

Store (training): ``$MLFLOW_TRACKING_URI``, else the config's ``train.mlflow_tracking_uri``, else
``sqlite:///<cwd>/results/mlflow.db`` (MLflow 3 refuses the old ``./mlruns`` file store). The stages
after training (eval, analyze, render) choose the same way from the *local* pipeline config
(:func:`stage_uri`), never from a store named in the run folder: a folder received from someone
else must not decide where this machine writes. On a cluster, point MLFLOW_TRACKING_URI at a
tracking server rather than at one sqlite file shared over NFS.

Artifacts of a sqlite store live beside it, in ``mlartifacts/<experiment>/`` (so results/ holds the
store and its artifacts together), under absolute ``file://`` locations: MLflow resolves a relative
location against the current directory of whichever process reads it, so a relative one would
break under ``cd``. When the store has been moved or copied, :func:`client` re-points the
locations recorded in it at the ``mlartifacts`` folder beside its new place.

A new sqlite store is created (schema migrations) by the first client that opens it; two jobs
doing that at once collide (``table _alembic_tmp_experiments already exists``), so opening a
sqlite store is serialised with a lock file beside it, as is finding-or-creating a named run.
"""

from __future__ import annotations

import fcntl
import os
import re
from contextlib import contextmanager
from pathlib import Path

from stateloop.runs import TRAIN_SUMMARY

DEFAULT_DB = Path("results") / "mlflow.db"
ARTIFACTS = "mlartifacts"  # beside a sqlite store
DEFAULT_EXPERIMENT = "stateloop"  # train.mlflow_experiment's default


def tracking_uri(*configured: str | None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or next((u for u in configured if u), "")
    if not uri:
        uri = f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"
    if _db_path(uri):
        _db_path(uri).parent.mkdir(parents=True, exist_ok=True)
    return uri


def _db_path(uri: str) -> Path | None:
    """The file of a sqlite store URI, else None."""
    return Path(uri[len("sqlite:///"):].split("?")[0]) if uri.startswith("sqlite:///") else None


def same_store(a: str, b: str) -> bool:
    da, db = _db_path(a), _db_path(b)
    return da.resolve() == db.resolve() if da and db else a.rstrip("/") == b.rstrip("/")


@contextmanager
def _store_lock(uri: str):
    if not _db_path(uri):
        yield
        return
    _db_path(uri).parent.mkdir(parents=True, exist_ok=True)
    with open(str(_db_path(uri)) + ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def client(uri: str):
    """An MlflowClient on ``uri`` whose store exists, is fully migrated and (sqlite) points at the
    artifacts beside it."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)  # creates / migrates the store now, under the lock
        if _db_path(uri):
            _repoint_artifacts(_db_path(uri))
    return c


def _folder_name(experiment: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)


def artifact_location(uri: str, experiment: str) -> str | None:
    """``file://.../mlartifacts/<experiment>`` beside a sqlite store; None (the server's choice) otherwise."""
    db = _db_path(uri)
    return f"{(db.resolve().parent / ARTIFACTS).as_uri()}/{_folder_name(experiment)}" if db else None


def _repoint_artifacts(db: Path) -> None:
    """Point the experiments made here (location ``.../mlartifacts/<experiment>``), and their runs,
    at the ``mlartifacts`` folder beside the store file, where a move or copy of results/ took them."""
    import sqlite3

    con = sqlite3.connect(db, timeout=60)
    try:
        with con:  # one transaction
            rows = con.execute("SELECT experiment_id, name, artifact_location FROM experiments "
                               "WHERE artifact_location LIKE 'file://%'").fetchall()
            for exp_id, name, old in rows:
                new = artifact_location(f"sqlite:///{db}", name)
                if old == new or not old.endswith(f"/{ARTIFACTS}/{_folder_name(name)}"):
                    continue
                con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, exp_id))
                con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                            "WHERE experiment_id = ? AND substr(artifact_uri, 1, ?) = ?",
                            (new, len(old) + 1, exp_id, len(old) + 1, old + "/"))
    finally:
        con.close()


def experiment_id(c, name: str) -> str:
    """The id of the MLflow experiment ``name``, created when absent (its artifacts beside a sqlite store)."""
    from mlflow.exceptions import MlflowException

    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=artifact_location(c.tracking_uri, name))
    except MlflowException:  # created meanwhile by a parallel job
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def standard_tags(command: str) -> dict[str, str]:
    """MLflow's own tags (the UI's "User", "Source", "Git commit") for a run made by ``stateloop COMMAND``."""
    import getpass

    from stateloop.runs import code_version

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    tags = {"mlflow.user": user, "mlflow.source.name": f"stateloop {command}",
            "mlflow.source.type": "JOB" if os.environ.get("SLURM_JOB_ID") else "LOCAL"}
    if code_version() != "unknown":
        tags["mlflow.source.git.commit"] = code_version().removesuffix("+dirty")
    return tags


def named_run(c, experiment: str, filter_string: str, name: str, tags: dict) -> str:
    """The newest run of ``experiment`` matching ``filter_string``, else a new one named ``name``
    with ``tags``; parallel jobs on one sqlite store find or make the same run."""
    exp_id = experiment_id(c, experiment)
    with _store_lock(c.tracking_uri):
        found = c.search_runs([exp_id], filter_string=filter_string, max_results=1, order_by=["attributes.start_time DESC"])
        return found[0].info.run_id if found else c.create_run(exp_id, run_name=name, tags=tags).info.run_id


def log_params(c, run_id: str, params: dict[str, str], changed_prefix: str) -> None:
    """Log params once: only keys not logged before (MLflow params are immutable); a changed value
    is kept as the tag ``{changed_prefix}{key}``."""
    from mlflow.entities import Param

    existing = c.get_run(run_id).data.params
    new = [Param(k, v[:6000]) for k, v in params.items() if k not in existing]
    for i in range(0, len(new), 100):
        c.log_batch(run_id, params=new[i : i + 100])
    for key, value in params.items():
        if key in existing and existing[key] != value[:6000]:
            c.set_tag(run_id, f"{changed_prefix}{key}", value[:5000])


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


def _local_train_setting(config: dict | None, config_file=None):
    """The ``train:`` section (TrainConfig) of the run's scale in the local pipeline config:
    ``config_file``, else the config file the run was trained from when it exists here (as the
    eval settings), else None."""
    run = (config or {}).get("run") if isinstance((config or {}).get("run"), dict) else {}
    if not config_file and run.get("config") and Path(run["config"]).is_file():
        config_file = run["config"]
    if not config_file:
        return None
    from stateloop.experiments import load_pipeline

    scale = load_pipeline(config_file).scales.get(run.get("scale"))
    return scale.train if scale is not None else None


def stage_uri(config: dict | None, config_file=None) -> str:
    """The store of a stage after training: $MLFLOW_TRACKING_URI, else the local pipeline config's
    ``train.mlflow_tracking_uri`` for the run's scale, else the local default. Never the store that
    train.json or the run's saved config names."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return tracking_uri()
    train = _local_train_setting(config, config_file)
    return tracking_uri(train.mlflow_tracking_uri if train is not None else None)


def run_of(run_dir, run_id: str, config: dict | None, config_file=None, command: str = "eval"):
    """(client, MLflow run id) of a run folder, for the stages after training, in :func:`stage_uri`'s store.

    The MLflow run is the one RUN_DIR/train.json names (``mlflow_run_id``) when the store holds it;
    a train.json recording this store (or none) whose run is missing is an error. Otherwise (a run
    trained elsewhere, or logged to another store) the newest run named ``run_id`` in the run's
    ``train.mlflow_experiment`` (default "stateloop"), created when absent and found again next time."""
    from mlflow.exceptions import MlflowException

    from stateloop.config import ConfigError

    summary = train_summary(run_dir)
    uri = stage_uri(config, config_file)
    c = client(uri)
    mlflow_id, recorded = summary.get("mlflow_run_id"), summary.get("mlflow_tracking_uri")
    if mlflow_id:
        try:
            c.get_run(mlflow_id)
            return c, mlflow_id
        except MlflowException:
            if not recorded or same_store(recorded, uri):
                raise ConfigError(f"{Path(run_dir) / TRAIN_SUMMARY}: mlflow_run_id {mlflow_id} is not in the MLflow store {uri}") from None
    train = (config or {}).get("train") if isinstance((config or {}).get("train"), dict) else {}
    experiment = train.get("mlflow_experiment") or DEFAULT_EXPERIMENT
    tags = {"run_id": run_id, **standard_tags(command)}
    return c, named_run(c, experiment, f"attributes.run_name = '{run_id}'", run_id, tags)


if __name__ == "__main__":  # python -m stateloop.tracking [URI]: open (and re-point) a moved store
    import sys

    print(client(sys.argv[1] if len(sys.argv) > 1 else tracking_uri()).tracking_uri)
