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
