"""The eval settings a run is evaluated with: ``stateloop eval`` and the analyses (whose held-out
set is the held-out perplexity's) read them here, as training reads its run's config through
pipeline.resolve_run.

A run folder is data, never code: it may come from someone else. [choice] The settings that name
code to import or files to read (:data:`LOCAL_ONLY`: the local task folder, whose YAMLs name
Python hooks, and the tasks' data folders) come only from a config file named on the command
line (``--config``) or from ``--set``; never from the run folder, neither from the `eval` section
saved in its config nor from the pipeline config file it names (``run.config``), whose value
settings (tasks, shots, ...) still apply. Without them: the checkout's ``workflow/tasks/`` and no
task data. The MLflow store follows the same rule (tracking.stage_uri)."""

from __future__ import annotations

from pathlib import Path

from stateloop.config import from_dict, merge, to_dict
from stateloop.evaluate.config import EvalConfig
from stateloop.pipeline import load_scale
from stateloop.runs import run_id_of, saved_config

LOCAL_ONLY = ("task_dir", "task_data")  # eval keys never taken from a run folder (module docstring)


def resolve_eval_config(run_dir, config_file: str | None = None, overrides: dict | None = None) -> EvalConfig:
    """EvalConfig for a run: the `eval` section of the run's scale in ``config_file`` (default:
    the pipeline config the run was trained from, ``run.config`` of its resolved config, when that
    file exists; else an `eval` section saved in the resolved config; else the defaults), then
    ``overrides``. Only ``config_file`` and ``overrides`` set the keys of :data:`LOCAL_ONLY`."""
    run_config = saved_config(run_dir)
    data = dict(run_config.get("eval") or {}) if isinstance(run_config.get("eval"), dict) else {}
    run_section = run_config.get("run") if isinstance(run_config.get("run"), dict) else {}
    given = bool(config_file)
    if not config_file and isinstance(run_section.get("config"), str) and Path(run_section["config"]).is_file():
        config_file = run_section["config"]
    if config_file:
        scale = run_section.get("scale") or run_id_of(run_dir, run_config).split("/")[0]
        data = to_dict(load_scale(config_file, scale).eval)
    if not given:
        data = {k: v for k, v in data.items() if k not in LOCAL_ONLY}
    data = merge(data, overrides or {})
    return from_dict(EvalConfig, data, "eval")
