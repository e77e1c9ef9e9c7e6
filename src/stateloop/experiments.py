"""Pipeline configs: scales, experiments, and their expansion into runs.

A config file (``configs/*.yaml``) has two sections::

    scales:        # name -> the sections every run at that scale shares (model shape, ...)
      410m: {model: {n_layers: 24, d_model: 1024, ...}}
    experiments:   # name -> a grid of runs; a table or figure reads one or more experiments
      table4: {scale: 410m, models: [stateloop, state_only], K: [7], d_state: [1024]}
      table1: {scale: 1.4b, models: [vanilla_looped, mesh], K: [4], K_by_model: {mesh: [10]}}

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
from stateloop.evaluate.config import EvalConfig
from stateloop.train.config import TrainConfig


@dataclass
class StageResources:
    """What one job of a stage asks the scheduler for (Snakemake resources; SLURM under
    ``--profile slurm``). Training's nodes and GPUs come from the scale's ``train`` section."""

    runtime: int = 60  # minutes
    mem_mb: int = 4000
    cpus_per_task: int = 2
    gpus: int = 0  # GPUs per job of the stages other than train (partitions: profiles/slurm)


@dataclass
class ResourcesConfig:
    tokenize: StageResources = field(default_factory=StageResources)
    train: StageResources = field(default_factory=StageResources)
    eval: StageResources = field(default_factory=StageResources)
    analyze: StageResources = field(default_factory=StageResources)
    bench: StageResources = field(default_factory=StageResources)


@dataclass
class ScaleConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)


@dataclass
class ExperimentConfig:
    scale: str
    models: list[str]
    K: list[int] = field(default_factory=lambda: [4])
    d_state: list[int] = field(default_factory=lambda: [0])  # used by models with a state; others get 0
    options: dict[str, dict] = field(default_factory=dict)  # model name -> model.options overrides
    # model name -> its own loop counts, replacing K for that model (MeSH and Parcae count core
    # repetitions: 10 at 1.4B while the other Table 1 models loop K = 4 times)
    K_by_model: dict[str, list[int]] = field(default_factory=dict)
    # False for shapes that are only measured, never trained (Table 3's decoding rows): such an
    # experiment defines no runs unless it is asked for by name.
    trained: bool = True


@dataclass
class BenchConfig:
    """Table 3's decoding benchmark (``stateloop bench decode``); the paper's protocol by default."""

    prefill: int = 1024  # prompt tokens P
    tokens: int = 1024  # generated tokens N
    repeats: int = 5  # timed runs per model
    warmup: int = 1
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU


@dataclass
class PipelineConfig:
    scales: dict[str, ScaleConfig]
    experiments: dict[str, ExperimentConfig] = field(default_factory=dict)
    bench: BenchConfig = field(default_factory=BenchConfig)


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
    return pipeline_from_dict(data, str(path))


def pipeline_from_dict(data: dict, where: str = "config") -> PipelineConfig:
    """Check a config mapping (as Snakemake holds it) strictly and build the pipeline config."""
    try:
        cfg = from_dict(PipelineConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    validate_pipeline(cfg, where)
    return cfg


def validate_pipeline(cfg: PipelineConfig, where: str = "config") -> None:
    from stateloop.models.registry import MODELS

    for name, exp in cfg.experiments.items():
        if exp.scale not in cfg.scales:
            raise ConfigError(f"{where}: experiments.{name}.scale: unknown scale {exp.scale!r} (defined: {', '.join(cfg.scales)})")
        for model in list(exp.models) + list(exp.options) + list(exp.K_by_model):
            if model not in MODELS:
                raise ConfigError(f"{where}: experiments.{name}.models: unknown model {model!r} (registered: {', '.join(MODELS)})")
    # Every split a stage reads must be one the data stage makes (evaluation and the analyses
    # read eval.heldout_split, training's validation train.val_split).
    for name, scale in cfg.scales.items():
        splits = scale.data.splits
        reads = [("eval.heldout_split", scale.eval.heldout_split)]
        if scale.train.val_tokens:
            reads.append(("train.val_split", scale.train.val_split))
        for key, split in reads:
            if split not in splits:
                raise ConfigError(f"{where}: scales.{name}.{key}: {split!r} is not a split the data stage makes "
                                  f"(data: {', '.join(splits)})")
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
    names = experiments if experiments is not None else [n for n, e in cfg.experiments.items() if e.trained]
    for name in names:
        if name not in cfg.experiments:
            raise ConfigError(f"experiments.{name}: not defined (defined: {', '.join(cfg.experiments)})")
        exp = cfg.experiments[name]
        scale = cfg.scales[exp.scale]
        for model in exp.models:
            spec = get_spec(model)
            widths = exp.d_state if spec.has_state else [0]
            for K in exp.K_by_model.get(model, exp.K):
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
