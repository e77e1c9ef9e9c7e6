"""MLflow tracking of a training run (rank 0 only).

- Tracking URI: ``$MLFLOW_TRACKING_URI``, else ``train.mlflow_tracking_uri``, else
  ``sqlite:///<absolute cwd>/results/mlflow.db`` (MLflow 3.17 refuses the ``./mlruns`` file store).
- Experiment: ``train.mlflow_experiment``; run name: the run id ``{scale}/{model}/K{K}_ds{ds}``,
  so every attempt of a run carries one stable name.
- Params: the resolved config flattened to dotted keys (``model.d_model``, ``train.lr``, ...);
  tags: scale, model, K, d_s, code version.
- Metrics: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``,
  ``train/tokens``, ``train/mfu`` (GPU), ``val/loss``, ``val/ppl``, indexed by optimiser step.
- A resumed run continues the MLflow run whose id its checkpoint (and RUN_DIR/mlflow.json) holds.

The client API (``MlflowClient``) is used instead of the fluent ``mlflow.start_run`` so that no
global "active run" leaks between runs trained in one process (tests, notebooks).
"""

from __future__ import annotations

import time


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


class Tracker:
    """One MLflow run. ``run_id`` given: continue it (a resumed training run)."""

    def __init__(self, uri: str, experiment: str, run_name: str, run_id: str | None = None, tags: dict | None = None):
        from stateloop.tracking import client, experiment_id

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
        if self.run_id is None:
            exp_id = experiment_id(self.client, experiment)
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags or {}).info.run_id
        self._pending: list = []

    def log_params(self, params: dict[str, str]) -> None:
        """Log params once; on a resumed run, only keys not logged before (MLflow params are immutable)."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new = [Param(k, v[:6000]) for k, v in params.items() if k not in existing]
        changed = {k: v for k, v in params.items() if k in existing and existing[k] != v[:6000]}
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])
        for key, value in changed.items():  # a resume with a changed (non-model) setting: keep a trace
            self.client.set_tag(self.run_id, f"changed_on_resume.{key}", value[:5000])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Queued to MLflow's background logger: a sqlite commit (~tens of ms) never stalls a step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        op = self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()],
                                   synchronous=False)
        self._pending.append(op)

    def flush(self) -> None:
        for op in self._pending:
            op.wait()
        self._pending.clear()

    def finish(self, status: str = "FINISHED") -> None:
        """status: FINISHED, FAILED or KILLED (stopped by a signal, to be continued)."""
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
