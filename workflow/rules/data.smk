rule tokenize:
    output:
        "data/{scale}/meta.json",
    log:
        "logs/tokenize/{scale}.log",
    threads: lambda wc: stage(wc.scale, "tokenize").cpus_per_task
    resources:
        runtime=lambda wc: stage(wc.scale, "tokenize").runtime,
        mem_mb=lambda wc: stage(wc.scale, "tokenize").mem_mb,
        cpus_per_task=lambda wc: stage(wc.scale, "tokenize").cpus_per_task,
    params:
        config=job_config,
        data=settings("data"),
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop tokenize --config {params.config} --scale {wildcards.scale} --out data/{wildcards.scale}"
        " --no-progress > {log} 2>&1"
