# Figure 4's analyses of a trained run. Both evaluate the held-out set of the run's held-out PPL
# (the scale's eval.heldout_split / eval.heldout_windows in the pipeline config, as the eval
# rule), so their unmodified NLL is Table 4's; interventions calibrate on a sample of train.
# [choice] An analysis too long for one job (the paper's: the whole Pile validation split) runs as
# resources.analyze.{shapley,interventions}_shards jobs of whole batches, then a merge of their
# exact sums, the numbers of one job bit for bit; the interventions' shards share one calibration
# job. Each job keeps partial sums in the run folder and continues from them when it runs again
# (a retry after its time limit, a requeue): analysis/shards.py. With one shard, one job
# (analysis/jobs.py: the jobs of one run, which the estimates of ops/analysis_cost.py read too)
from stateloop.analysis import jobs as analysis_jobs
from stateloop.analysis.shards import SHARDS_DIR


rule shapley:
    input:
        model=rules.train.output.model,
        shards=lambda wc: analysis_jobs.shard_files(PIPE, run_of(wc), "shapley"),
    output:
        run_path("shapley.json"),
    log:
        run_log("shapley"),
    conda:
        "../../envs/stateloop.yaml"
    threads: lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["cpus_per_task"]
    resources:
        **gpu_routing(lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["gpus"]),
        runtime=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["runtime"],
        mem_mb=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["mem_mb"],
        cpus_per_task=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["cpus_per_task"],
        gpu=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "shapley")["gpus"],
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
        merge=lambda wc: analysis_jobs.merge_flag(PIPE, wc.scale, "shapley"),
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
        " --shard {wildcards.shard:q}/{wildcards.shards:q} --no-progress > {log:q} 2>&1"


rule interventions:
    input:
        model=rules.train.output.model,
        calibration=lambda wc: analysis_jobs.calibration_files(PIPE, run_of(wc)),
        shards=lambda wc: analysis_jobs.shard_files(PIPE, run_of(wc), "interventions"),
    output:
        run_path("interventions.json"),
    log:
        run_log("interventions"),
    conda:
        "../../envs/stateloop.yaml"
    threads: lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["cpus_per_task"]
    resources:
        **gpu_routing(lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["gpus"]),
        runtime=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["runtime"],
        mem_mb=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["mem_mb"],
        cpus_per_task=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["cpus_per_task"],
        gpu=lambda wc: analysis_jobs.final_job(PIPE, wc.scale, "interventions")["gpus"],
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
        merge=lambda wc: analysis_jobs.merge_flag(PIPE, wc.scale, "interventions"),
    shell:
        "stateloop analyze interventions {params.run_dir:q} --config {params.config:q}{params.merge}" " --no-progress > {log:q} 2>&1"


rule interventions_calibration:
    input:
        rules.train.output.model,
    output:
        run_path(analysis_jobs.CALIBRATION_FILE),
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
        calibration=run_path(analysis_jobs.CALIBRATION_FILE),
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
        " --shard {wildcards.shard:q}/{wildcards.shards:q} --no-progress > {log:q} 2>&1"


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
