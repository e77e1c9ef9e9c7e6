"""A run's config, resolved: for training from the pipeline config and the run id
(:func:`resolve_run`, docs/architecture.md#how-a-runs-config-resolves), for evaluation from the
run folder's saved config with its ``eval`` section (:func:`resolve_eval`).

A run folder is data, never code: it may come from someone else. [choice] The settings that name
code to import or files to read (:data:`LOCAL_ONLY`) come only from ``--config`` or ``--set``,
never from the run folder nor the config file it names, whose value settings still apply. The
MLflow store follows the same rule (tracking.stages.stage_uri)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stateloop.config import ConfigError, from_dict, merge, parse_dotlist, to_dict
from stateloop.config.evaluate import EvalConfig
from stateloop.config.model import ModelConfig
from stateloop.config.pipeline import PipelineConfig
from stateloop.config.run import FIXED_BY_RUN_ID, RUN_SECTIONS, DataSection, RunConfig, RunSection
from stateloop.config.train import TrainConfig
from stateloop.experiments import load_checked, load_run, scale_of
from stateloop.models.registry import get_spec
from stateloop.runs import run_id_of, saved_config, saved_run_config

LOCAL_ONLY = ("task_dir", "task_data")  # eval keys never taken from a run folder (module docstring)


def resolve_run(config_path: str | Path, run_id: str, overrides: list[str] | None = None,
                data_dir: str | Path | None = None) -> RunConfig:
    """The resolved config of run ``run_id``: the scale's sections -> the experiment's model options
    -> the run id's model, K, d_s and seed -> ``key=value`` overrides (``train.lr=1e-3``,
    ``data.dir=...``), only of the run's sections and never a key its run id sets."""
    pipeline, run = load_run(config_path, run_id)
    scale = pipeline.scales[run.scale]
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
    if unknown := set(data_extra) - {"dir"}:
        raise ConfigError(f"data.{sorted(unknown)[0]}: unknown key (allowed: dir)")
    folder = data_dir or data_extra.get("dir")
    if not folder:
        raise ConfigError("--data-dir: no token-shard folder given (pass --data-dir DIR or --set data.dir=DIR)")
    section = RunSection(run_id, run.scale, str(config_path), list(run.experiments))
    return RunConfig(section, mcfg, tcfg, DataSection(str(Path(folder).resolve())))


def resolve_eval(run_dir, pipeline: PipelineConfig | None = None, overrides: dict | None = None,
                 saved: dict | None = None) -> RunConfig:
    """The run's saved RunConfig with its ``eval`` section: its scale's in ``pipeline`` (the
    ``--config``; default: the file ``run.config`` names, if it exists; else an `eval` section saved
    in the config; else the defaults), then ``overrides``. Only ``pipeline`` and ``overrides`` set
    :data:`LOCAL_ONLY`. ``saved``: the saved mapping if already read."""
    saved = saved_config(run_dir) if saved is None else saved
    run = saved_run_config(run_dir, saved)
    # An `eval` section a saved config may carry (RunConfig.read ignores it); local-only keys dropped below.
    data = dict(saved["eval"]) if isinstance(saved.get("eval"), dict) else {}
    given, where = pipeline is not None, "--config"
    if not given and run.run.config and Path(run.run.config).is_file():
        # The one config a stage loads itself: the command could not know it before reading the folder.
        pipeline, where = load_checked(run.run.config, expand=False)[0], run.run.config
    if pipeline is not None:
        scale = run.run.scale or run_id_of(run_dir, run).split("/")[0]
        data = to_dict(scale_of(pipeline, scale, f"{where}: scales.{scale}: not defined").eval)
    if not given:
        data = {k: v for k, v in data.items() if k not in LOCAL_ONLY}
    data = merge(data, overrides or {})
    return dataclasses.replace(run, eval=from_dict(EvalConfig, data, "eval"))
