# Figure 4's analyses of a trained run. Both evaluate the held-out set of the run's held-out PPL
# (the scale's eval.heldout_split / eval.heldout_windows in the pipeline config, as the eval
# rule), so their unmodified NLL is Table 4's; interventions calibrate on a sample of train.
rule shapley:
    input:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/model.pt",
    output:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/shapley.json",
    log:
        "logs/shapley/{scale}/{model}/K{K}_ds{ds}.log",
    threads: lambda wc: stage(wc.scale, "analyze").cpus_per_task
    resources:
        runtime=lambda wc: stage(wc.scale, "analyze").runtime,
        mem_mb=lambda wc: stage(wc.scale, "analyze").mem_mb,
        cpus_per_task=lambda wc: stage(wc.scale, "analyze").cpus_per_task,
        gpu=lambda wc: stage(wc.scale, "analyze").gpus,
    params:
        config=CONFIGFILE,
        eval=settings("eval"),  # the held-out set and precision (shared with the held-out PPL)
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop analyze shapley results/runs/{wildcards.scale}/{wildcards.model}/K{wildcards.K}_ds{wildcards.ds}"
        " --config {params.config} --no-progress > {log} 2>&1"


rule interventions:
    input:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/model.pt",
    output:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/interventions.json",
    log:
        "logs/interventions/{scale}/{model}/K{K}_ds{ds}.log",
    threads: lambda wc: stage(wc.scale, "analyze").cpus_per_task
    resources:
        runtime=lambda wc: stage(wc.scale, "analyze").runtime,
        mem_mb=lambda wc: stage(wc.scale, "analyze").mem_mb,
        cpus_per_task=lambda wc: stage(wc.scale, "analyze").cpus_per_task,
        gpu=lambda wc: stage(wc.scale, "analyze").gpus,
    params:
        config=CONFIGFILE,
        eval=settings("eval"),  # the held-out set and precision (shared with the held-out PPL)
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop analyze interventions results/runs/{wildcards.scale}/{wildcards.model}/K{wildcards.K}_ds{wildcards.ds}"
        " --config {params.config} --no-progress > {log} 2>&1"


rule bench_decode:
    output:
        "results/bench/decode.json",
    log:
        "logs/bench/decode.log",
    threads: lambda wc: stage(PIPE.experiments["decoding"].scale, "bench").cpus_per_task
    resources:
        runtime=lambda wc: stage(PIPE.experiments["decoding"].scale, "bench").runtime,
        mem_mb=lambda wc: stage(PIPE.experiments["decoding"].scale, "bench").mem_mb,
        cpus_per_task=lambda wc: stage(PIPE.experiments["decoding"].scale, "bench").cpus_per_task,
        gpu=lambda wc: stage(PIPE.experiments["decoding"].scale, "bench").gpus,
    params:
        config=CONFIGFILE,
        scale=PIPE.experiments["decoding"].scale,
        models=decode_models(),
        bench=(f"--prefill {PIPE.bench.prefill} --tokens {PIPE.bench.tokens} --repeats {PIPE.bench.repeats}"
               f" --warmup {PIPE.bench.warmup} --dtype {PIPE.bench.dtype}"),
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop bench decode --config {params.config} --scale {params.scale} --models {params.models}"
        " {params.bench} --output {output} --no-progress > {log} 2>&1"
