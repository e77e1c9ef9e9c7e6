"""The eval settings a run is evaluated with: ``stateloop eval`` and the analyses (whose held-out
set is the held-out perplexity's) read them here, as training reads its run's config through
train/resolve.py."""

from __future__ import annotations

from pathlib import Path

from stateloop.config import ConfigError, from_dict, merge, to_dict
from stateloop.evaluate.config import EvalConfig
from stateloop.experiments import load_pipeline
from stateloop.runs import run_id_of, saved_config


def resolve_eval_config(run_dir, config_file: str | None = None, overrides: dict | None = None) -> EvalConfig:
    """EvalConfig for a run: the `eval` section of the run's scale in ``config_file`` (default:
    the pipeline config the run was trained from, ``run.config`` of its resolved config, when that
    file exists; else an `eval` section saved in the resolved config; else the defaults), then
    ``overrides``."""
    run_config = saved_config(run_dir)
    data = dict(run_config.get("eval") or {})
    run_section = run_config.get("run") if isinstance(run_config.get("run"), dict) else {}
    if not config_file and run_section.get("config") and Path(run_section["config"]).is_file():
        config_file = run_section["config"]
    if config_file:
        pipeline = load_pipeline(config_file)
        scale = run_section.get("scale") or run_id_of(run_dir, run_config).split("/")[0]
        if scale not in pipeline.scales:
            raise ConfigError(f"{config_file}: scales.{scale}: not defined (the run's scale; defined: {', '.join(pipeline.scales)})")
        data = to_dict(pipeline.scales[scale].eval)
    data = merge(data, overrides or {})
    return from_dict(EvalConfig, data, "eval")
