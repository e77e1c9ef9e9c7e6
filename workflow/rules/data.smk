rule tokenize:
    output:
        meta="data/{scale}/meta.json",
    log:
        "logs/tokenize/{scale}.log",
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("tokenize")
    resources:
        **job_resources("tokenize"),
    params:
        config=job_config,
        data=settings("data"),
    shell:
        "stateloop tokenize --config {params.config:q} --scale {wildcards.scale:q} --out data/{wildcards.scale:q}"
        " --no-progress > {log:q} 2>&1"
