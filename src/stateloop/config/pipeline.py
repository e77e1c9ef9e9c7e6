"""A pipeline config (``configs/*.yaml``): ``scales`` (name -> the sections its runs share),
``experiments`` (name -> a grid of runs a table or figure reads), ``bench`` and ``slurm``; the
grid's expansion into runs is experiments.py."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from stateloop.config import Bool, ConfigError, Int, Text, section
from stateloop.config.data import DataConfig
from stateloop.config.evaluate import EvalConfig
from stateloop.config.model import ModelConfig
from stateloop.config.resources import ResourcesConfig, SlurmConfig
from stateloop.config.train import TrainConfig


@section
class ScaleConfig:
    model: ModelConfig = Field(default_factory=ModelConfig, description="the model's shape (each run sets name, K, d_s)")
    data: DataConfig = Field(default_factory=DataConfig, description="the corpus and tokenizer")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="held-out PPL, lm-eval tasks and the analyses' settings")
    train: TrainConfig = Field(default_factory=TrainConfig, description="hardware, batch, optimiser, budget, logging")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="what each stage's job asks the scheduler for")
    paper: Bool = Field(False, description="True only for a scale that is the paper's own (its model shape, data and token budget): then "
        "the tables compare absolute numbers (parameters, PPL, latency) with the paper's (ours - paper). At any other scale only "
        "scale-free quantities are set beside the paper's: each model's change relative to its reference (Vanilla Looped, StateLoop in "
        "Table 4).")


@section
class ExperimentConfig:
    scale: Annotated[Text, Field(description="the scale (a key of scales) whose settings every run of the experiment takes")]
    models: list[Text] | None = Field(None, description="None: PAPER_MODELS of the experiment's name (required for other names)")
    K: list[Int] = Field(default_factory=lambda: [4], description="loop counts, one run per K")
    d_s: list[Int] = Field(default_factory=lambda: [0], description="used by models with a state; others get 0")
    options: dict[Text, dict] = Field(default_factory=dict, description="model name -> model.options overrides")
    K_by_model: dict[Text, list[Int]] = Field(default_factory=dict, description="model name -> its own loop counts, replacing K for that "
        "model (MeSH and Parcae count core repetitions: 10 at 1.4B while the other Table 1 models loop K = 4 times)")
    trained: Bool = Field(True, description="False for shapes that are only measured, never trained (Table 3's decoding rows): such an "
        "experiment defines no runs unless it is asked for by name.")
    seeds: list[Int] = Field(default_factory=list, description="One run per seed; empty: the scale's train.seed alone. Runs of one seed "
        "see the same data order, so models are compared seed by seed.")
    test_time_K: list[Int] = Field(default_factory=list, description="Test-time depths (this project's study, not the paper's): each run "
        "is also evaluated at every K' listed into its eval_depth.json (`stateloop eval RUN --depths ...`).")
    test_time_tasks: Bool = Field(False, description="also run the lm-eval tasks at every test-time K'")
    baseline: Text | None = Field(None, description="The model the others are compared with in the experiment's own comparison (an "
        "experiment of two models or more that no table or figure of the paper reads: results/compare_NAME.csv and .md, "
        "figures/compare_NAME.pdf where it varies K); null: vanilla_looped, which must then be one of its models")

    def __post_init__(self) -> None:
        for K in self.test_time_K:
            if K < 1:
                raise ConfigError(f"test_time_K: {K!r} is not a positive loop count")
        if len(set(self.test_time_K)) != len(self.test_time_K):
            raise ConfigError(f"test_time_K: {self.test_time_K} lists a depth twice")
        for s in self.seeds:
            if s < 0:
                raise ConfigError(f"seeds: {s!r} is not a non-negative integer")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds: {self.seeds} lists a seed twice")


@section(key="bench")
class BenchConfig:
    """Table 3's decoding benchmark (``stateloop bench decode``); the paper's protocol by default."""

    prefill: Int = Field(1024, gt=0, description="prompt tokens P")
    tokens: Int = Field(1024, gt=0, description="generated tokens N")
    repeats: Int = Field(5, gt=0, description="timed runs per model")
    warmup: Int = Field(1, ge=0, description="untimed runs per model before the timed ones")
    dtype: Text = Field("auto", description="auto: bfloat16 on CUDA, float32 on CPU")
    interleave: Literal["token", "run"] = Field("token", description="token: all models decode in lockstep, one token each in turn, so "
        "every model sees the same machine state (the job also runs alone: workflow/rules/analysis.smk); run: whole runs round-robin, "
        "the paper's literal protocol.")


@section
class PipelineConfig:
    scales: Annotated[dict[Text, ScaleConfig], Field(description="scale name -> its settings")]
    experiments: dict[Text, ExperimentConfig] = Field(default_factory=dict, description="experiment name -> its runs")
    bench: BenchConfig = Field(default_factory=BenchConfig, description="Table 3's decoding benchmark")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="the cluster: GPU jobs' partition and type, limits, write speed")

