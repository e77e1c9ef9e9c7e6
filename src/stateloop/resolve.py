"""A run's config, resolved: for training, from the pipeline config and the run id
(:func:`resolve_run`, docs/architecture.md#how-a-runs-config-resolves); for evaluation, from the
run folder's saved config with its ``eval`` section (:func:`resolve_eval`). Both return a
:class:`~stateloop.pipeline.RunConfig`; every failure is a one-line :class:`ConfigError` naming the
key or file.

The eval settings a run is evaluated with: ``stateloop eval`` and the analyses (whose held-out
set is the held-out perplexity's) read the run's RunConfig with its ``eval`` section resolved here
(pipeline.RunConfig.eval), as training reads its run's config through :func:`resolve_run`.

A run folder is data, never code: it may come from someone else. [choice] The settings that name
code to import or files to read (:data:`LOCAL_ONLY`: the local task folder, whose YAMLs name
Python hooks, and the tasks' data folders) come only from a config file named on the command
line (``--config``) or from ``--set``; never from the run folder, neither from the `eval` section
saved in its config nor from the pipeline config file it names (``run.config``), whose value
settings (tasks, shots, ...) still apply. Without them: the checkout's ``workflow/tasks/`` and no
task data. The MLflow store follows the same rule (tracking.stages.stage_uri)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stateloop.config import ConfigError, from_dict, merge, parse_dotlist, to_dict
from stateloop.models.config import ModelConfig
from stateloop.models.registry import get_spec
from stateloop.pipeline import (
    FIXED_BY_RUN_ID,
    RUN_SECTIONS,
    DataSection,
    PipelineConfig,
    RunConfig,
    RunSection,
    load_checked,
    load_run,
    scale_of,
)
from stateloop.runs import run_id_of, saved_config, saved_run_config
from stateloop.sections.evaluate import EvalConfig
from stateloop.sections.train import TrainConfig

LOCAL_ONLY = ("task_dir", "task_data")  # eval keys never taken from a run folder (module docstring)


def resolve_run(config_path: str | Path, run_id: str, overrides: list[str] | None = None,
                data_dir: str | Path | None = None) -> RunConfig:
    """The resolved config of run ``run_id`` of the pipeline config ``config_path``.

    Resolution order: the scale's sections -> the experiment's model options (an experiment of the
    config must define the run: an unknown id is refused) -> the run id's model, K, d_s and seed
    (the seed replaces ``train.seed``) -> ``key=value`` overrides (``train.lr=1e-3``,
    ``model.norm_eps=1e-6``, ``data.dir=...``; overriding one of ``train.max_steps`` /
    ``train.max_tokens`` replaces the scale's budget given by the other). Every failure is a
    one-line :class:`ConfigError` naming the key or file."""
    pipeline, run = load_run(config_path, run_id)
    scale = pipeline.scales[run.scale]
    extra = _run_overrides(overrides, run_id)
    mcfg = from_dict(ModelConfig, merge(to_dict(run.model_config), extra.get("model", {})), "model")
    get_spec(mcfg.name).check(mcfg)
    train_extra = dict(extra.get("train", {}))
    # The budget is one of two keys: overriding one replaces the scale's other.
    for key, other in (("max_steps", "max_tokens"), ("max_tokens", "max_steps")):
        if key in train_extra and other not in train_extra:
            train_extra[other] = 0
    tcfg = from_dict(TrainConfig, merge(to_dict(scale.train), {**train_extra, "seed": run.seed}), "train")
    tcfg.check_budget()
    if tcfg.seq_len > mcfg.max_seq_len:
        raise ConfigError(f"train.seq_len: {tcfg.seq_len} exceeds model.max_seq_len = {mcfg.max_seq_len}")
    data_extra = dict(extra.get("data", {}))
    unknown = set(data_extra) - {"dir"}
    if unknown:
        raise ConfigError(f"data.{sorted(unknown)[0]}: unknown key (allowed: dir)")
    folder = data_dir or data_extra.get("dir")
    if not folder:
        raise ConfigError("--data-dir: no token-shard folder given (pass --data-dir DIR or --set data.dir=DIR)")
    section = RunSection(run_id, run.scale, str(config_path), list(run.experiments))
    return RunConfig(section, mcfg, tcfg, DataSection(str(Path(folder).resolve())))


def _run_overrides(overrides: list[str] | None, run_id: str) -> dict:
    """``key=value`` overrides of a run as nested sections, checked: only the run's sections, and
    never a key its run id sets."""
    extra = parse_dotlist(overrides or [])
    for section in extra:
        if section not in RUN_SECTIONS:
            raise ConfigError(f"{section}: unknown section in override (allowed: {', '.join(RUN_SECTIONS)})")
        if not isinstance(extra[section], dict):
            raise ConfigError(f"{section}: override must name a key inside the section, e.g. {section}.key=value")
    for key in FIXED_BY_RUN_ID:
        if key in extra.get("model", {}):
            raise ConfigError(f"model.{key}: set by the run id {run_id}, not by an override")
    if "seed" in extra.get("train", {}):
        raise ConfigError(f"train.seed: set by the run id {run_id} (its _seed suffix), not by an override")
    return extra


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
        pipeline, where = load_checked(run.run.config, expand=False)[0], run.run.config
    if pipeline is not None:
        scale = run.run.scale or run_id_of(run_dir, run).split("/")[0]
        data = to_dict(scale_of(pipeline, scale, f"{where}: scales.{scale}: not defined").eval)
    if not given:
        data = {k: v for k, v in data.items() if k not in LOCAL_ONLY}
    data = merge(data, overrides or {})
    return dataclasses.replace(run, eval=from_dict(EvalConfig, data, "eval"))
