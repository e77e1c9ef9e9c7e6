"""The jobs of Figure 4's analyses for one run, read by the DAG (workflow/rules/analysis.smk) and
the estimates (ops/analysis_cost.py). No torch here: the Snakefile imports this module.

[choice] ``resources.analyze.<analysis>_shards`` = N: one job for N = 1; above, N shard jobs
(``--shard I/N``), after one calibration job for the interventions (``--calibrate-only``), then
the merge (``--merge N``: MERGE_JOB's resources, no GPU; analysis/shards.py says why it is exact).
"""

from __future__ import annotations

from stateloop.analysis.shards import MERGE_JOB, SHARDS_DIR

ANALYSES = ("shapley", "interventions")
CALIBRATION_FILE = "interventions_calibration.pt"  # in the run folder (analysis/stage.py writes it)


def shard_count(pipe, scale: str, analysis: str) -> int:
    """The number of jobs the scale splits ``analysis`` into."""
    if analysis not in ANALYSES:
        raise ValueError(f"no analysis {analysis!r} (known: {', '.join(ANALYSES)})")
    return getattr(pipe.scales[scale].resources.analyze, f"{analysis}_shards")


def shard_files(pipe, run, analysis: str) -> list[str]:
    """The shard files the merge reads, in the run's folder (none for one shard)."""
    n = shard_count(pipe, run.scale, analysis)
    return [] if n == 1 else [f"{run.folder}/{SHARDS_DIR}/{analysis}_{i}of{n}.json" for i in range(1, n + 1)]


def calibration_files(pipe, run) -> list[str]:
    """The interventions' shared calibration, which its own job makes above one shard."""
    return [] if shard_count(pipe, run.scale, "interventions") == 1 else [f"{run.folder}/{CALIBRATION_FILE}"]


def merge_flag(pipe, scale: str, analysis: str) -> str:
    """What the job that writes the analysis JSON adds to its command: `` --merge N`` above one shard."""
    n = shard_count(pipe, scale, analysis)
    return "" if n == 1 else f" --merge {n}"


def stage_job(pipe, scale: str) -> dict:
    """The analyze stage's resources (runtime, mem_mb, cpus_per_task, gpus): one analysis, one shard,
    the calibration."""
    res = pipe.scales[scale].resources.analyze
    return {key: getattr(res, key) for key in ("runtime", "mem_mb", "cpus_per_task", "gpus")}


def final_job(pipe, scale: str, analysis: str) -> dict:
    """The resources of the job that writes the analysis JSON: the whole analysis's (one shard), or
    the merge's (MERGE_JOB, its runtime and memory at most the stage's)."""
    stage = stage_job(pipe, scale)
    if shard_count(pipe, scale, analysis) == 1:
        return stage
    return {**MERGE_JOB, "runtime": min(MERGE_JOB["runtime"], stage["runtime"]),
            "mem_mb": min(MERGE_JOB["mem_mb"], stage["mem_mb"])}
