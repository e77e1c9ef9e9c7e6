"""MLflow tracking of a training run (rank 0 only).

- Tracking URI: ``$MLFLOW_TRACKING_URI``, else ``train.mlflow_tracking_uri``, else
  ``sqlite:///<absolute cwd>/results/mlflow.db`` (MLflow 3.17 refuses the ``./mlruns`` file store).
- Experiment: ``train.mlflow_experiment``; run name: the run id ``{scale}/{model}/K{K}_ds{ds}``,
  so every attempt of a run carries one stable name.
- Params: the resolved config flattened to dotted keys (``model.d_model``, ``train.lr``, ...);
  tags: scale, model, K, d_s, code version, and MLflow's own (user, source, git commit).
- Metrics: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``,
  ``train/tokens``, ``train/mfu`` (GPU), ``val/loss``, ``val/ppl`` and, for the StateLoop family,
  the state's diagnostics ``val/state/<quantity>_<i>`` (evaluate/diagnostics.py), indexed by
  optimiser step. Evaluation adds ``eval/state/<quantity>`` curves stepped by the state index i.
- A resumed run continues the MLflow run whose id its checkpoint holds. An attempt killed after
  its checkpoint may have logged steps beyond it: the resumed attempt skips a metric at a step
  the run already holds (resuming is exact, so the value there is the one it would log), so every
  step appears once. After an inexact resume (a setting changed: train.json's ``inexact_resume``,
  the tag ``stateloop.inexact_resume``) the redone steps are logged again: MLflow's latest value of
  each is the new one.
- An attempt that starts from scratch (no checkpoint) opens a new MLflow run; the previous
  attempt's run (RUN_DIR/mlflow.json), still RUNNING because its process was killed (SIGKILL, a
  lost node: nothing could close it), is marked KILLED. Its process is gone for certain: the
  training holds the run folder's lock.

The client API (``MlflowClient``) is used instead of the fluent ``mlflow.start_run`` so that no
global "active run" leaks between runs trained in one process (tests, notebooks)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from stateloop.tracking.records import log_params, standard_tags
from stateloop.tracking.store import client, experiment_id


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
