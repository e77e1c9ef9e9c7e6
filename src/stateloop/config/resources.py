"""What each stage's jobs ask the scheduler for (``scales.SCALE.resources``), and the cluster a
DAG is sent to (``slurm``): Snakemake resources, SLURM's under ``--profile slurm``."""

from __future__ import annotations

import re

from pydantic import Field

from stateloop.config import ConfigError, Float, Int, Text, section


@section
class StageResources:
    """What one job of a stage asks the scheduler for (Snakemake resources; SLURM under
    ``--profile slurm``). Training's nodes and GPUs come from the scale's ``train`` section."""

    runtime: Int = Field(60, description="minutes")
    mem_mb: Int = Field(4000, description="memory per job")
    cpus_per_task: Int = Field(2, description="CPUs per task (the job's threads)")
    gpus: Int = Field(0, description="GPUs per job of the stages other than train (partitions: profiles/slurm)")


@section(key="analyze")
class AnalyzeResources(StageResources):
    """The analyze stage's jobs: each of Figure 4's analyses may be split into shards over the
    held-out windows, merged bit for bit (analysis/shards.py; hours: ops/analysis_cost.py)."""

    shapley_shards: Int = Field(1, ge=1, description="Jobs the Shapley analysis of a run is split into (1: one job); above 1, each shard "
        "is a job of this stage's resources and their merge a job without a GPU.")
    interventions_shards: Int = Field(1, ge=1, description="Jobs the interventions of a run are split into (1: one job); above 1, one "
        "calibration job first, then the shards, then their merge.")


@section
class ResourcesConfig:
    tokenize: StageResources = Field(default_factory=StageResources)
    train: StageResources = Field(default_factory=StageResources)
    eval: StageResources = Field(default_factory=StageResources)
    analyze: AnalyzeResources = Field(default_factory=AnalyzeResources)
    bench: StageResources = Field(default_factory=StageResources)


_SLURM_WORD = re.compile(r"[A-Za-z0-9_.-]+")  # a partition, QOS or GRES type: one word, as sinfo prints it


@section(key="slurm")
class SlurmConfig:
    """The cluster a DAG is sent to (`--profile slurm`); the account and the other jobs'
    partition stay the profile's (docs/cluster.md)."""

    gpu_partition: Text = Field("", description="The partition of every job that asks for a GPU, whatever its rule: a training on GPUs and "
        "every job of a stage whose `resources.STAGE.gpus` is above 0 (its other jobs keep the profile's slurm_partition); \"\": the "
        "profile's slurm_partition for every job")
    gpu_type: Text = Field("", description="The GPU type as the cluster's GRES names it (`sinfo -o \"%G\"`, e.g. h100): trainings ask for "
        "gres gpu:TYPE:N, the other GPU jobs for --gpus=TYPE:N; \"\": any GPU (gpu:N)")
    gpu_constraint: Text = Field("", description="--constraint of every GPU job (node features, e.g. 'h100|a100'); \"\": none")
    gpu_qos: Text = Field("", description="--qos of every GPU job; \"\": the profile's (slurm-qos, or a default-resources qos)")
    max_runtime: Int = Field(0, ge=0, description="The partitions' MaxTime in minutes (`sinfo -o \"%P %l\"`): a longer "
        "`resources.STAGE.runtime` is refused by the config check (SLURM would keep it pending for ever); 0: not checked")
    write_mb_per_s: Float = Field(100.0, description="The run folders' file system's write speed in MB/s (docs/cluster.md: dd ... "
        "conv=fsync): it sizes each training job's warning before its time limit and the least train.dist_timeout_s")

    def __post_init__(self) -> None:
        for key in ("gpu_partition", "gpu_type", "gpu_qos"):
            value = getattr(self, key)
            if value and not _SLURM_WORD.fullmatch(value):
                raise ConfigError(f"slurm.{key}: {value!r} is not one word (letters, digits, '_', '.', '-')")
        if "'" in self.gpu_constraint or '"' in self.gpu_constraint:
            raise ConfigError(f"slurm.gpu_constraint: {self.gpu_constraint!r}: give it without quotes")
        if not self.write_mb_per_s > 0:
            raise ConfigError(f"slurm.write_mb_per_s: must be a measured speed above 0, got {self.write_mb_per_s!r}")

