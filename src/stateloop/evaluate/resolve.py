"""The eval settings a run is evaluated with: ``stateloop eval`` and the analyses (whose held-out
set is the held-out perplexity's) read the run's RunConfig with its ``eval`` section resolved here
(pipeline.RunConfig.eval), as training reads its run's config through pipeline.resolve_run.

A run folder is data, never code: it may come from someone else. [choice] The settings that name
code to import or files to read (:data:`LOCAL_ONLY`: the local task folder, whose YAMLs name
Python hooks, and the tasks' data folders) come only from a config file named on the command
line (``--config``) or from ``--set``; never from the run folder, neither from the `eval` section
saved in its config nor from the pipeline config file it names (``run.config``), whose value
settings (tasks, shots, ...) still apply. Without them: the checkout's ``workflow/tasks/`` and no
task data. The MLflow store follows the same rule (tracking.stage_uri)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stateloop.config import from_dict, merge, to_dict
from stateloop.evaluate.config import EvalConfig
from stateloop.pipeline import PipelineConfig, RunConfig, load_pipeline, scale_of
from stateloop.runs import run_id_of, saved_config, saved_run_config

LOCAL_ONLY = ("task_dir", "task_data")  # eval keys never taken from a run folder (module docstring)


def resolve_eval(run_dir, pipeline: PipelineConfig | None = None, overrides: dict | None = None,
                 saved: dict | None = None) -> RunConfig:
    """The run's saved RunConfig with its ``eval`` section: the `eval` section of the run's scale in
    ``pipeline``, the config named on the command line and loaded by the command (default: the
    pipeline config the run was trained from, ``run.config`` of its resolved config, when that file
    exists; else an `eval` section saved in the resolved config; else the defaults), then
    ``overrides``. Only ``pipeline`` and ``overrides`` set the keys of :data:`LOCAL_ONLY`.
    ``saved``: the saved mapping already read (runs.load_model's second value), else it is read here."""
    saved = saved_config(run_dir) if saved is None else saved
    run = saved_run_config(run_dir, saved)
    # An `eval` section a saved config may carry beside RunConfig's saved sections (RunConfig.read
    # ignores it): its value settings, as an EvalConfig mapping; the local-only keys are dropped below.
    data = dict(saved["eval"]) if isinstance(saved.get("eval"), dict) else {}
    given, where = pipeline is not None, "--config"
    if not given and run.run.config and Path(run.run.config).is_file():
        # The one pipeline config a stage loads itself: the file the run folder names, which the
        # command could not know before reading the folder (value settings only, as above).
        pipeline, where = load_pipeline(run.run.config), run.run.config
    if pipeline is not None:
        scale = run.run.scale or run_id_of(run_dir, run).split("/")[0]
        data = to_dict(scale_of(pipeline, scale, f"{where}: scales.{scale}: not defined").eval)
    if not given:
        data = {k: v for k, v in data.items() if k not in LOCAL_ONLY}
    data = merge(data, overrides or {})
    return dataclasses.replace(run, eval=from_dict(EvalConfig, data, "eval"))
