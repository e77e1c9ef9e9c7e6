"""A run's final weights as an MLflow model: logged once as a LoggedModel of the run's experiment
(the Hugging Face directory of export/hf.py), and registered as a version of a named model when asked."""

from __future__ import annotations

import re
from pathlib import Path

from stateloop.export.hf import export_run

# MLflow refuses these in a logged model's name (and '/' and ':' in a registered model's)
MODEL_NAME_FORBIDDEN = re.compile(r"[/:.%\"']")
LOGGED_MODEL_TYPE = "transformers (trust_remote_code)"  # what the artifacts are: a Hugging Face directory


def log_model(c, run_id: str, run_dir, run_name: str, params: dict[str, str], tags: dict[str, str],
              step: int, register: str = "") -> str:
    """The run's final weights as an MLflow LoggedModel (export/hf.py's Hugging Face directory),
    linked to the run as its output at ``step``, and its id. A READY model this run already logged
    is kept; one a killed attempt left PENDING is marked FAILED. ``register``: also a version of
    the registered model of that name."""
    import tempfile

    from mlflow.entities import LoggedModelOutput

    exp_id = c.get_run(run_id).info.experiment_id
    mine = c.search_logged_models([exp_id], filter_string=f"source_run_id = '{run_id}'")
    ready = [m for m in mine if str(m.status) == "READY"]
    for m in mine:
        if str(m.status) == "PENDING":
            c.finalize_logged_model(m.model_id, "FAILED")
    if ready:
        model_id = ready[0].model_id
    else:
        # tiny/stateloop/K4_ds32_seed1 -> tiny-stateloop-K4_ds32_seed1; the run id itself is the tag stateloop.run
        model = c.create_logged_model(exp_id, name=MODEL_NAME_FORBIDDEN.sub("-", run_name), source_run_id=run_id,
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
