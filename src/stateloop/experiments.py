"""Pipeline configs: scales, experiments, and their expansion into runs.

A config file (``configs/*.yaml``) has two sections::

    scales:        # name -> the sections every run at that scale shares (model shape, ...)
      410m: {model: {n_layers: 24, d_model: 1024, ...}}
    experiments:   # name -> a grid of runs; a table or figure reads one or more experiments
      table4: {scale: 410m, models: [stateloop, state_only], K: [7], d_state: [1024]}

A run is (scale, model, K, d_s), with d_s = 0 for models without a persistent state. Runs are
deduplicated across experiments: one run used by several tables is trained once. Its folder is
``results/runs/{scale}/{model}/K{K}_ds{ds}/`` (ARCHITECTURE.md, Names).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from stateloop.config import ConfigError, ModelConfig, from_dict, load_yaml, merge, to_dict
from stateloop.data.config import DataConfig
from stateloop.train.config import TrainConfig


@dataclass
class ScaleConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class ExperimentConfig:
    scale: str
    models: list[str]
    K: list[int] = field(default_factory=lambda: [4])
    d_state: list[int] = field(default_factory=lambda: [0])  # used by models with a state; others get 0
    options: dict[str, dict] = field(default_factory=dict)  # model name -> model.options overrides


@dataclass
class PipelineConfig:
    scales: dict[str, ScaleConfig]
    experiments: dict[str, ExperimentConfig] = field(default_factory=dict)


@dataclass
class Run:
    scale: str
    model: str
    K: int
    d_s: int
    model_config: ModelConfig
    experiments: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.scale}/{self.model}/K{self.K}_ds{self.d_s}"

    @property
    def folder(self) -> str:
        return f"results/runs/{self.id}"


def load_pipeline(path: str | Path, overrides: dict | None = None) -> PipelineConfig:
    data = load_yaml(path)
    if overrides:
        data = merge(data, overrides)
    try:
        cfg = from_dict(PipelineConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    validate_pipeline(cfg, str(path))
    return cfg


def validate_pipeline(cfg: PipelineConfig, where: str = "config") -> None:
    from stateloop.models.registry import MODELS

    for name, exp in cfg.experiments.items():
        if exp.scale not in cfg.scales:
            raise ConfigError(f"{where}: experiments.{name}.scale: unknown scale {exp.scale!r} (defined: {', '.join(cfg.scales)})")
        for model in list(exp.models) + list(exp.options):
            if model not in MODELS:
                raise ConfigError(f"{where}: experiments.{name}.models: unknown model {model!r} (registered: {', '.join(MODELS)})")
    # Building every run's config checks the variant options and shape constraints early.
    expand_runs(cfg)


def run_model_config(scale: ScaleConfig, model: str, K: int, d_s: int, options: dict | None = None) -> ModelConfig:
    """The resolved model config of one run: the scale's shape with name, K, d_s and options set."""
    from stateloop.models.registry import get_spec

    spec = get_spec(model)
    base = to_dict(scale.model)
    merged_options = merge(base.get("options", {}), options or {})
    cfg = dataclasses.replace(scale.model, name=model, K=K, d_state=d_s if spec.has_state else 0, options=merged_options)
    spec.check(cfg)
    return cfg


def expand_runs(cfg: PipelineConfig, experiments: list[str] | None = None) -> list[Run]:
    """Every run the chosen experiments define, deduplicated, in config order."""
    from stateloop.models.registry import get_spec

    runs: dict[str, Run] = {}
    names = experiments if experiments is not None else list(cfg.experiments)
    for name in names:
        if name not in cfg.experiments:
            raise ConfigError(f"experiments.{name}: not defined (defined: {', '.join(cfg.experiments)})")
        exp = cfg.experiments[name]
        scale = cfg.scales[exp.scale]
        for model in exp.models:
            spec = get_spec(model)
            widths = exp.d_state if spec.has_state else [0]
            for K in exp.K:
                for d_s in widths:
                    try:
                        mcfg = run_model_config(scale, model, K, d_s, exp.options.get(model))
                    except ConfigError as err:
                        raise ConfigError(f"experiments.{name} ({model}, K={K}, d_s={d_s}): {err}") from None
                    run = Run(exp.scale, model, K, mcfg.d_state, mcfg)
                    run = runs.setdefault(run.id, run)
                    if name not in run.experiments:
                        run.experiments.append(name)
    return list(runs.values())
