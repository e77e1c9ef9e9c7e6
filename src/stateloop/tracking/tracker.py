"""MLflow tracking of a training run (rank 0 only).

- Tracking URI: ``$MLFLOW_TRACKING_URI``, else ``train.mlflow_tracking_uri``, else
  ``sqlite:///<absolute cwd>/results/mlflow.db`` (MLflow 3.17 refuses the ``./mlruns`` file store).
- Experiment: ``train.mlflow_experiment``; run name: the run id ``{scale}/{model}/K{K}_ds{ds}``,
  so every attempt of a run carries one stable name.
- Params: the resolved config flattened to dotted keys; metrics ``train/*``, ``val/*`` (and the
  state's diagnostics ``val/state/<quantity>_<i>``) by optimiser step.
- A resumed run continues the MLflow run its checkpoint names and skips steps the run already
  holds (resuming is exact); after an inexact resume the redone steps are logged again.
- An attempt from scratch opens a new run and marks the previous attempt's, still RUNNING after a
  kill, KILLED (its process is gone for certain: the training holds the run folder's lock).

The client API (``MlflowClient``) is used instead of the fluent ``mlflow.start_run`` so that no
global "active run" leaks between runs trained in one process (tests, notebooks)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from stateloop.config.train import registered_model_name
from stateloop.data.shards import read_meta
from stateloop.data.tokenizer import TOKENIZER_FILE
from stateloop.files import atomic_write_json, code_version
from stateloop.runs import MLFLOW_FILE
from stateloop.tracking.records import flatten, log_datasets, log_params, standard_tags
from stateloop.tracking.registry import log_model
from stateloop.tracking.store import client, experiment_id, tracking_uri


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


def open_training_run(rc, run_dir: Path, run_id: str | None, inexact: list[str], step: int, datasets: dict) -> Tracker:
    """The MLflow run of training ``rc`` (a RunConfig) in ``run_dir``: the one ``run_id`` names (a
    resumed run's, from its checkpoint), else a new one; after an inexact resume the redone steps are
    logged again, with their new values. Logs the params and ``datasets`` (name -> ShardSet), and
    names the run in RUN_DIR/mlflow.json."""
    run, tcfg = rc.run, rc.train
    tags = {"scale": run.scale, "model": run.model, "K": str(run.K), "d_s": str(rc.d_s),
            "code_version": code_version(), "config_file": run.config}
    tracker = Tracker(tracking_uri(tcfg.mlflow_tracking_uri), tcfg.mlflow_experiment, run.id, run_id=run_id, tags=tags,
                      previous=run_dir / MLFLOW_FILE, exact=not inexact, system_metrics_s=tcfg.mlflow_system_metrics_s)
    if inexact:
        tracker.client.set_tag(tracker.run_id, "stateloop.inexact_resume", f"from step {step}: {'; '.join(inexact)}"[:5000])
    tracker.log_params(flatten(rc.as_dict()))
    atomic_write_json(run_dir / MLFLOW_FILE, {"tracking_uri": tracker.uri, "experiment": tcfg.mlflow_experiment,
                                              "run_id": tracker.run_id, "run_name": run.id})
    log_datasets(tracker.client, tracker.run_id, run.scale, datasets)
    return tracker


def log_final_model(tracker: Tracker, rc, run_dir: Path, params: int, step: int) -> str | None:
    """The final weights as the run's MLflow model (registry.log_model), registered where
    train.mlflow_register_model names a model; None without a tokenizer to export with."""
    r, tcfg, data_dir = rc.run, rc.train, Path(rc.data.dir)
    tokenizer = read_meta(data_dir).get("tokenizer") if (data_dir / "meta.json").is_file() else None
    if not (isinstance(tokenizer, dict) and (data_dir / tokenizer.get("file", TOKENIZER_FILE)).is_file()):
        print(f"stateloop train: {data_dir}: no tokenizer file beside the shards, so no MLflow model is logged "
              "(the export needs one; train.mlflow_log_model)", file=sys.stderr, flush=True)
        return None
    fields = {"scale": r.scale, "model": r.model, "K": r.K, "d_s": rc.d_s}
    register = registered_model_name(tcfg.mlflow_register_model, **fields) if tcfg.mlflow_register_model else ""
    return log_model(tracker.client, tracker.run_id, run_dir, r.id, {**{k: str(v) for k, v in fields.items()},
                     "params": str(params)}, {"code_version": code_version()}, step, register=register)
