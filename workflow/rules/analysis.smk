# Figure 4's analyses of a trained run. Both evaluate the held-out set of the run's held-out PPL
# (the scale's eval.heldout_split / eval.heldout_windows in the pipeline config, as the eval
# rule), so their unmodified NLL is Table 4's; interventions calibrate on a sample of train.
rule shapley:
    input:
        rules.train.output.model,
    output:
        run_path("shapley.json"),
    log:
        run_log("shapley"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("analyze")
    resources:
        **job_resources("analyze"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
    shell:
        "stateloop analyze shapley {params.run_dir:q}" " --config {params.config:q} --no-progress > {log:q} 2>&1"


rule interventions:
    input:
        rules.train.output.model,
    output:
        run_path("interventions.json"),
    log:
        run_log("interventions"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("analyze")
    resources:
        **job_resources("analyze"),
    params:
        config=job_config,
        heldout=settings("eval", HELDOUT_KEYS),  # the held-out set and precision (the held-out PPL's), no more
        run_dir=run_dir,
    shell:
        "stateloop analyze interventions {params.run_dir:q}" " --config {params.config:q} --no-progress > {log:q} 2>&1"


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
