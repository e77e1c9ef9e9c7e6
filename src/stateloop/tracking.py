"""The MLflow store every stage logs to, and a client that is safe to open from parallel jobs.

Store (training): ``$MLFLOW_TRACKING_URI``, else the config's ``train.mlflow_tracking_uri``, else
``sqlite:///<cwd>/results/mlflow.db`` (MLflow 3 refuses the old ``./mlruns`` file store). The stages
after training (eval, analyze, render) choose the same way from the pipeline config named on their
command line (:func:`stage_uri`), never from a store named in the run folder or in the config file
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
import json
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.files import code_version
from stateloop.pipeline import PipelineConfig, RunConfig
from stateloop.runs import TRAIN_SUMMARY

DEFAULT_DB = Path("results") / "mlflow.db"
ARTIFACTS = "mlartifacts"  # beside a sqlite store
DEFAULT_EXPERIMENT = "stateloop"  # train.mlflow_experiment's default
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


def log_datasets(c, run_id: str, scale: str, shard_sets: dict) -> None:
    """Each split a run read as an MLflow dataset input (the runs table's Datasets column):
    ``shard_sets`` maps MLflow's context ("training", "validation") to a data.shards.ShardSet.
    Name ``<scale>/<split>``; digest the split's fingerprint (its shard files, token counts and
    checksums in meta.json: equal exactly when the tokens are); source the meta.json; profile
    the split's token and document counts and its own source (files, hash split). MLflow keeps
    one input per dataset and context, so a resumed run logs nothing twice, and one dataset per
    name and digest in an experiment: runs that read the same tokens share it (the first source)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = []
    for context, shards in shard_sets.items():
        split = shards.meta["splits"][shards.split]
        tokenizer = shards.meta.get("tokenizer")
        profile = {"split": shards.split, "tokens": split.get("tokens"), "documents": split.get("documents"),
                   "split_source": split.get("source"), "vocab_size": shards.vocab_size,
                   "tokenizer": tokenizer.get("kind") if isinstance(tokenizer, dict) else None}
        dataset = Dataset(name=f"{scale}/{shards.split}", digest=shards.fingerprint(), source_type="local",
                          source=json.dumps({"uri": str((shards.dir / "meta.json").resolve())}),
                          profile=json.dumps(profile))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)]))
    c.log_inputs(run_id, datasets=inputs)


# MLflow refuses these in a logged model's name (and '/' and ':' in a registered model's)
MODEL_NAME_FORBIDDEN = re.compile(r"[/:.%\"']")
LOGGED_MODEL_TYPE = "transformers (trust_remote_code)"  # what the artifacts are: a Hugging Face directory


def logged_model_name(run_name: str) -> str:
    """A run id as MLflow allows a logged model's name: tiny/stateloop/K4_ds32_seed1 ->
    tiny-stateloop-K4_ds32_seed1 (the run id itself is the model's tag ``stateloop.run``)."""
    return MODEL_NAME_FORBIDDEN.sub("-", run_name)


def log_model(c, run_id: str, run_dir, run_name: str, params: dict[str, str], tags: dict[str, str],
              step: int, register: str = "") -> str:
    """The run's final weights as an MLflow LoggedModel of its experiment, and its id: the Hugging
    Face directory of export/hf.py (config.json, model.safetensors, the tokenizer files and the
    modeling code; `AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)` loads a
    download of it), linked to the run as its output at ``step``. A READY model this run already
    logged (a finish redone after a kill) is kept, not logged twice; one a killed attempt left
    PENDING is marked FAILED. ``register``: also a version of the registered model of that name."""
    import tempfile

    from mlflow.entities import LoggedModelOutput

    from stateloop.export.hf import export_run

    exp_id = c.get_run(run_id).info.experiment_id
    mine = c.search_logged_models([exp_id], filter_string=f"source_run_id = '{run_id}'")
    ready = [m for m in mine if str(m.status) == "READY"]
    for m in mine:
        if str(m.status) == "PENDING":
            c.finalize_logged_model(m.model_id, "FAILED")
    if ready:
        model_id = ready[0].model_id
    else:
        model = c.create_logged_model(exp_id, name=logged_model_name(run_name), source_run_id=run_id,
                                      params=params, tags={"stateloop.run": run_name, **tags},
                                      model_type=LOGGED_MODEL_TYPE)
        model_id = model.model_id
        try:
            with tempfile.TemporaryDirectory(prefix="stateloop-model-") as tmp:
                c.log_model_artifacts(model_id, str(export_run(run_dir, Path(tmp) / "hf")))
        except BaseException:
            c.finalize_logged_model(model_id, "FAILED")
            raise
        c.finalize_logged_model(model_id, "READY")
        c.log_outputs(run_id, [LoggedModelOutput(model_id, step)])
    if register:
        _register(c, register, model_id, run_id)
    return model_id


def _register(c, name: str, model_id: str, run_id: str) -> None:
    """A version of registered model ``name`` for the logged model, unless it has one already."""
    from mlflow.exceptions import MlflowException

    try:
        c.create_registered_model(name)
    except MlflowException as err:
        if "already exists" not in str(err).lower() and getattr(err, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
            raise
    if any(v.source == f"models:/{model_id}" for v in c.search_model_versions(f"name = '{name}'")):
        return
    c.create_model_version(name, source=f"models:/{model_id}", run_id=run_id, model_id=model_id)


def standard_tags(command: str) -> dict[str, str]:
    """MLflow's own tags (the UI's "User", "Source", "Git commit") for a run made by ``stateloop COMMAND``."""
    import getpass


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


def _local_train_setting(config: RunConfig | None, pipeline: PipelineConfig | None = None):
    """The ``train:`` section (TrainConfig) of the run's scale in the pipeline config named on the
    command line (``pipeline``, loaded by the command), else None. Never the config file the run
    folder names (``run.config``): a received folder could name one of its own (resolve.py)."""
    if pipeline is None:
        return None
    scale = pipeline.scales.get(config.run.scale if config else None)
    return scale.train if scale is not None else None


def stage_uri(config: RunConfig | None, pipeline: PipelineConfig | None = None) -> str:
    """The store of a stage after training: $MLFLOW_TRACKING_URI, else the ``train.mlflow_tracking_uri``
    of the run's scale in the pipeline config named on the command line, else the local default.
    Never the store that train.json, the run's saved config or the config file it names gives."""
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return tracking_uri()
    train = _local_train_setting(config, pipeline)
    return tracking_uri(train.mlflow_tracking_uri if train is not None else None)


def run_of(run_dir, run_id: str, config: RunConfig | None, pipeline: PipelineConfig | None = None, command: str = "eval"):
    """(client, MLflow run id) of a run folder, for the stages after training, in :func:`stage_uri`'s store.

    The MLflow run is the one RUN_DIR/train.json names (``mlflow_run_id``) when the store holds it;
    a train.json recording this store (or none) whose run is missing is an error. Otherwise (a run
    trained elsewhere, or logged to another store) the newest run named ``run_id`` in the run's
    ``train.mlflow_experiment`` (default "stateloop"), created when absent and found again next time."""
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


if __name__ == "__main__":  # python -m stateloop.tracking [URI]: open (and re-point) a moved store
    import sys

    print(client(sys.argv[1] if len(sys.argv) > 1 else tracking_uri()).tracking_uri)


# ----------------------------------------------------------------------------------------------
# Training runs (rank 0 only)
#
# MLflow tracking of a training run (rank 0 only).
#
# - Tracking URI: ``$MLFLOW_TRACKING_URI``, else ``train.mlflow_tracking_uri``, else
#   ``sqlite:///<absolute cwd>/results/mlflow.db`` (MLflow 3.17 refuses the ``./mlruns`` file store).
# - Experiment: ``train.mlflow_experiment``; run name: the run id ``{scale}/{model}/K{K}_ds{ds}``,
#   so every attempt of a run carries one stable name.
# - Params: the resolved config flattened to dotted keys (``model.d_model``, ``train.lr``, ...);
#   tags: scale, model, K, d_s, code version, and MLflow's own (user, source, git commit).
# - Metrics: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``,
#   ``train/tokens``, ``train/mfu`` (GPU), ``val/loss``, ``val/ppl`` and, for the StateLoop family,
#   the state's diagnostics ``val/state/<quantity>_<i>`` (evaluate/diagnostics.py), indexed by
#   optimiser step. Evaluation adds ``eval/state/<quantity>`` curves stepped by the state index i.
# - A resumed run continues the MLflow run whose id its checkpoint holds. An attempt killed after
#   its checkpoint may have logged steps beyond it: the resumed attempt skips a metric at a step
#   the run already holds (resuming is exact, so the value there is the one it would log), so every
#   step appears once. After an inexact resume (a setting changed: train.json's ``inexact_resume``,
#   the tag ``stateloop.inexact_resume``) the redone steps are logged again: MLflow's latest value of
#   each is the new one.
# - An attempt that starts from scratch (no checkpoint) opens a new MLflow run; the previous
#   attempt's run (RUN_DIR/mlflow.json), still RUNNING because its process was killed (SIGKILL, a
#   lost node: nothing could close it), is marked KILLED. Its process is gone for certain: the
#   training holds the run folder's lock.
#
# The client API (``MlflowClient``) is used instead of the fluent ``mlflow.start_run`` so that no
# global "active run" leaks between runs trained in one process (tests, notebooks).


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """{"model": {"K": 3}} -> {"model.K": "3"}; lists and scalars become strings."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


def _run_id_in(path: Path | None) -> str | None:
    try:
        return json.loads(Path(path).read_text()).get("run_id") if path else None
    except (OSError, ValueError, AttributeError):
        return None


class Tracker:
    """One MLflow run. ``run_id`` given: continue it (a resumed training run). ``previous``: the
    mlflow.json of an earlier attempt of this run folder. ``exact``: the resume redoes the steps
    a killed attempt logged with the same values, so those are not logged again; an inexact one
    (a changed setting) logs them again: MLflow's latest value of each step is then the new one."""

    def __init__(self, uri: str, experiment: str, run_name: str, run_id: str | None = None, tags: dict | None = None,
                 previous: Path | None = None, exact: bool = True, system_metrics_s: float = 0.0):

        self.uri = uri
        self.client = client(uri)
        self.run_id = None
        if run_id:
            try:
                run = self.client.get_run(run_id)
                if run.info.run_name == run_name:
                    self.run_id = run_id
                    self.client.update_run(run_id, status="RUNNING")
            except Exception:  # noqa: BLE001 - the store was moved or reset: start a new run
                self.run_id = None
        continued = self.run_id is not None
        self._close_dead_attempt(_run_id_in(previous), run_name)
        self._logged = self._logged_steps() if self.run_id and exact else {}
        if self.run_id is None:
            exp_id = experiment_id(self.client, experiment)
            self.run_id = self.client.create_run(exp_id, run_name=run_name,
                                                 tags={**standard_tags("train"), **(tags or {})}).info.run_id
        self._pending: list = []
        self.monitor = self._system_metrics(system_metrics_s, resumed=continued) if system_metrics_s else None

    def _system_metrics(self, every_s: float, resumed: bool):
        """MLflow's own monitor of this node (``system/...`` metrics, stepped by sample), in a
        thread; a resumed run continues its steps."""
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(self.run_id, sampling_interval=every_s, resume_logging=resumed,
                                       tracking_uri=self.uri)
        monitor.start()
        return monitor

    def _close_dead_attempt(self, old: str | None, run_name: str) -> None:
        if not old or old == self.run_id:
            return
        try:
            run = self.client.get_run(old)
        except Exception:  # noqa: BLE001 - another store: nothing to close here
            return
        if run.info.status == "RUNNING" and run.info.run_name == run_name:
            self.client.set_tag(old, "stateloop.killed", "its process ended without closing the run; "
                                                         "the next attempt of the run folder found it")
            self.client.set_terminated(old, status="KILLED")

    def _logged_steps(self) -> dict[str, set[int]]:
        """The steps logged of each metric of the continued run (a killed attempt's background
        logger may have left gaps, so a set rather than the last step)."""
        keys = self.client.get_run(self.run_id).data.metrics
        return {k: {m.step for m in self.client.get_metric_history(self.run_id, k)} for k in keys}

    def log_params(self, params: dict[str, str]) -> None:
        """Log params once; on a resumed run, only keys not logged before (MLflow params are
        immutable); a resume with a changed (non-model) setting keeps it as a ``changed_on_resume.*`` tag."""

        log_params(self.client, self.run_id, params, "changed_on_resume.")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Queued to MLflow's background logger: a sqlite commit (~tens of ms) never stalls a step.
        Steps a killed attempt already logged are skipped."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items() if step not in self._logged.get(k, ())]
        if batch:
            self._pending.append(self.client.log_batch(self.run_id, metrics=batch, synchronous=False))

    def flush(self) -> None:
        for op in self._pending:
            op.wait()
        self._pending.clear()

    def finish(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED (stopped by a signal, to be continued)."""
        if self.monitor is not None:
            self.monitor.finish()  # its last samples, before the run is closed
            self.monitor = None
        self.flush()
        self.client.set_terminated(self.run_id, status=status)


# ----------------------------------------------------------------------------------------------
# The stages after training: eval and the analyses log into the run's MLflow run


def log_stage(run_dir, run_id: str, config: RunConfig | None, pipeline: PipelineConfig | None, command: str, prefix: str,
              metrics: dict, curves: dict | None = None, params: dict | None = None, tags: dict | None = None,
              artifact: tuple | None = None, datasets: dict | None = None) -> str:
    """Log one stage's results into the run's MLflow run (:func:`run_of`: the one train.json names,
    else the run named by the run id) and return its id.

    ``metrics`` as ``{prefix}/<name>`` at step 0; each curve ``{name: [(index, value), ...]}`` as one
    metric ``{prefix}/<name>`` with the index as its step (one chart per curve); ``params`` as
    params (a later call with other values keeps them as ``changed_on_re{command}.<key>`` tags:
    MLflow params cannot change); ``tags`` as tags; ``artifact`` = (a file path or a dict, the
    artifact path: a folder for a file, a file name for a dict); ``datasets`` {context: ShardSet}
    as the run's dataset inputs (:func:`log_datasets`, named by the run id's scale)."""
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
