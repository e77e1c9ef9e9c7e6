# Figure 4's analyses of a trained run. Both evaluate the held-out set of the run's held-out PPL
# (the scale's eval.heldout_split / eval.heldout_windows in the pipeline config, as the eval
# rule), so their unmodified NLL is Table 4's; interventions calibrate on a sample of train.
# [choice] An analysis too long for one job (the paper's: the whole Pile validation split) runs as
# resources.analyze.{shapley,interventions}_shards jobs of whole batches, then a merge of their
# exact sums, the numbers of one job bit for bit; the interventions' shards share one calibration
# job. Each job keeps partial sums in the run folder and continues from them when it runs again
# (a retry after its time limit, a requeue): analysis/shards.py. With one shard, one job.
from stateloop.analysis.shards import MERGE_JOB, SHARDS_DIR


def analysis_shards(wc, analysis):
    """The number of jobs the scale splits ``analysis`` into."""
    return getattr(stage(wc.scale, "analyze"), f"{analysis}_shards")


def shard_files(analysis):
    """Input function: the shard files the merge reads (none for one shard)."""

    def files(wc):
        n = analysis_shards(wc, analysis)
        return [] if n == 1 else [f"{run_dir(wc)}/{SHARDS_DIR}/{analysis}_{i}of{n}.json" for i in range(1, n + 1)]

    return files


def calibration_file(wc):
    """Input function: the interventions' shared calibration, made by its own job above one shard."""
    return [] if analysis_shards(wc, "interventions") == 1 else [f"{run_dir(wc)}/interventions_calibration.pt"]


def merge_flag(analysis):
    """Params value: ``--merge N`` where the analysis runs as N > 1 shards."""
    return lambda wc: "" if analysis_shards(wc, analysis) == 1 else f" --merge {analysis_shards(wc, analysis)}"


def analysis_threads(analysis):
    return lambda wc: stage(wc.scale, "analyze").cpus_per_task if analysis_shards(wc, analysis) == 1 else 1


def analysis_resources(analysis):
    """The analyze stage's resources for one job; the merge of N > 1 shards reads the shards' sums:
    MERGE_JOB's, no GPU, runtime and memory at most the stage's."""
    whole = job_resources("analyze")

    def pick(key, merged):
        def value(wc):
            if analysis_shards(wc, analysis) == 1:
                return whole[key](wc)
            return min(merged, whole[key](wc)) if key in ("runtime", "mem_mb") else merged

        return value

    merge = {"runtime": "runtime", "mem_mb": "mem_mb", "cpus_per_task": "cpus_per_task", "gpu": "gpus"}
    return {key: pick(key, MERGE_JOB[field]) for key, field in merge.items()}


rule shapley:
    input:
        model=rules.train.output.model,
        shards=shard_files("shapley"),
    output:
        run_path("shapley.json"),
    log:
        run_log("shapley"),
    conda:
        "../../envs/stateloop.yaml"
    threads: analysis_threads("shapley")
    resources:
        **analysis_resources("shapley"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
        merge=merge_flag("shapley"),
    shell:
        "stateloop analyze shapley {params.run_dir:q} --config {params.config:q}{params.merge} --no-progress > {log:q} 2>&1"


rule shapley_shard:
    input:
        rules.train.output.model,
    output:
        run_path(f"{SHARDS_DIR}/shapley_{{shard}}of{{shards}}.json"),
    log:
        f"logs/shapley/{RUN_ID_FORM}_shard{{shard}}of{{shards}}.log",
    wildcard_constraints:
        shard=r"\d+",
        shards=r"\d+",
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("analyze")
    resources:
        **job_resources("analyze"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),
        run_dir=run_dir,
    shell:
        "stateloop analyze shapley {params.run_dir:q} --config {params.config:q}"
        " --shard {wildcards.shard}/{wildcards.shards} --no-progress > {log:q} 2>&1"


rule interventions:
    input:
        model=rules.train.output.model,
        calibration=calibration_file,
        shards=shard_files("interventions"),
    output:
        run_path("interventions.json"),
    log:
        run_log("interventions"),
    conda:
        "../../envs/stateloop.yaml"
    threads: analysis_threads("interventions")
    resources:
        **analysis_resources("interventions"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
        merge=merge_flag("interventions"),
    shell:
        "stateloop analyze interventions {params.run_dir:q} --config {params.config:q}{params.merge}" " --no-progress > {log:q} 2>&1"


rule interventions_calibration:
    input:
        rules.train.output.model,
    output:
        run_path("interventions_calibration.pt"),
    log:
        run_log("interventions_calibration"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("analyze")
    resources:
        **job_resources("analyze"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),
        run_dir=run_dir,
    shell:
        "stateloop analyze interventions {params.run_dir:q} --config {params.config:q} --calibrate-only" " --no-progress > {log:q} 2>&1"


rule interventions_shard:
    input:
        model=rules.train.output.model,
        calibration=run_path("interventions_calibration.pt"),
    output:
        run_path(f"{SHARDS_DIR}/interventions_{{shard}}of{{shards}}.json"),
    log:
        f"logs/interventions/{RUN_ID_FORM}_shard{{shard}}of{{shards}}.log",
    wildcard_constraints:
        shard=r"\d+",
        shards=r"\d+",
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("analyze")
    resources:
        **job_resources("analyze"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),
        run_dir=run_dir,
    shell:
        "stateloop analyze interventions {params.run_dir:q} --config {params.config:q}"
        " --shard {wildcards.shard}/{wildcards.shards} --no-progress > {log:q} 2>&1"


# Table 3 is timed alone: the job takes every core Snakemake was given (so no other job of the DAG
# runs beside it locally) and, under SLURM, a whole node (--exclusive); all models are timed in
# one process, decoding in lockstep (bench.interleave), with the paper's mean and std over runs.
rule bench_decode:
    output:
        f"results/{BENCH_FILE}",
    log:
        "logs/bench/decode.log",
    conda:
        "../../envs/stateloop.yaml"
    threads: all_cores
    resources:
        **job_resources("bench", scale=BENCH_SCALE),
        slurm_extra="'--exclusive'",
    params:  # the command reads its shapes and protocol from the config; these rerun it when they change
        config=job_config,
        scale=BENCH_SCALE,
        models=decode_models(),
        shape=json.dumps(to_dict(PIPE.scales[BENCH_SCALE].model), sort_keys=True) if BENCH_SCALE else "",  # a new shape: re-timed
        bench=(
            f"--prefill {PIPE.bench.prefill} --tokens {PIPE.bench.tokens} --repeats {PIPE.bench.repeats}"
            f" --warmup {PIPE.bench.warmup} --dtype {PIPE.bench.dtype} --interleave {PIPE.bench.interleave}"
        ),
    shell:
        "stateloop bench decode --config {params.config:q} --threads {threads} --out {output:q} --no-progress > {log:q} 2>&1"
