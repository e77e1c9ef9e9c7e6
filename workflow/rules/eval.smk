rule eval:
    input:
        rules.train.output.model,
    output:
        run_path("eval.json"),
    log:
        run_log("eval"),
    threads: job_threads("eval")
    resources:
        **job_resources("eval"),
    params:
        config=job_config,
        eval=settings("eval"),
        tasks=eval_tasks,
        run_dir=run_dir,
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop eval {params.run_dir:q}"
        " --config {params.config:q} {params.tasks} --no-progress > {log:q} 2>&1"
