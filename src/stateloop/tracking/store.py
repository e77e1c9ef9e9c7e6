"""The MLflow store every stage logs to, and a client that is safe to open from parallel jobs.

Store (training): ``$MLFLOW_TRACKING_URI``, else the config's ``train.mlflow_tracking_uri``, else
``sqlite:///<cwd>/results/mlflow.db`` (MLflow 3 refuses the old ``./mlruns`` file store). The stages
after training (eval, analyze, render) choose the same way from the pipeline config named on their
command line (:func:`stateloop.tracking.stages.stage_uri`), never from a store named in the run folder or in the config file
it names: a folder received from someone else must not decide where this machine writes. On a cluster, point MLFLOW_TRACKING_URI at a
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

DEFAULT_DB = Path("results") / "mlflow.db"
ARTIFACTS = "mlartifacts"  # beside a sqlite store
# The MLflow 3 UI opens an experiment in the view its kind tag names; untagged, it guesses, and an
# experiment of runs with metrics but no traces may open in the GenAI view.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


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
            _hide_empty_default(c)
    return c


def _hide_empty_default(c) -> None:
    """Delete (MLflow's soft delete: the UI lists it no more) the "Default" experiment a new
    sqlite store creates for itself, while it holds no run: every stage logs to its named
    experiment, so an empty Default would only be the first thing the UI shows. A Default with
    runs, or on a tracking server, is someone's and left alone."""
    from mlflow.entities import ViewType

    default = c.get_experiment("0")
    if default.lifecycle_stage == "active" and not c.search_runs(["0"], max_results=1, run_view_type=ViewType.ALL):
        c.delete_experiment("0")


def _folder_name(experiment: str) -> str:
    """The experiment's artifact folder under mlartifacts/: one path component, never . or ..
    (the name may come from a received run folder's config)."""
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment)
    return folder if folder.strip(".") else folder.replace(".", "_")


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
        if any(exp.tags.get(k) != v for k, v in EXPERIMENT_KIND.items()):  # made before the tag was set
            for k, v in EXPERIMENT_KIND.items():
                c.set_experiment_tag(exp.experiment_id, k, v)
        return exp.experiment_id
    try:
        return c.create_experiment(name, artifact_location=artifact_location(c.tracking_uri, name), tags=EXPERIMENT_KIND)
    except MlflowException:  # created meanwhile by a parallel job
        exp = c.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def named_run(c, experiment: str, filter_string: str, name: str, tags: dict) -> str:
    """The newest run of ``experiment`` matching ``filter_string``, else a new one named ``name``
    with ``tags``; parallel jobs on one sqlite store find or make the same run."""
    exp_id = experiment_id(c, experiment)
    with _store_lock(c.tracking_uri):
        found = c.search_runs([exp_id], filter_string=filter_string, max_results=1, order_by=["attributes.start_time DESC"])
        return found[0].info.run_id if found else c.create_run(exp_id, run_name=name, tags=tags).info.run_id
