rule eval:
    input:
        rules.train.output.model,
    output:
        run_path("eval.json"),
    log:
        run_log("eval"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("eval")
    resources:
        **job_resources("eval"),
    params:
        config=job_config,
        eval=settings("eval"),
        tasks=eval_tasks,
        run_dir=run_dir,
    shell:
        "stateloop eval {params.run_dir:q} --config {params.config:q} --no-progress > {log:q} 2>&1"


# Test-time depth (this project's study, not the paper's protocol): a run of an experiment with
# test_time_K, evaluated at each of those loop counts from one load of its weights.
rule eval_depth:
    input:
        rules.train.output.model,
    output:
        run_path("eval_depth.json"),
    log:
        run_log("eval_depth"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("eval")
    resources:
        **job_resources("eval"),
    params:
        config=job_config,
        eval=settings("eval"),
        depths=test_time_depths,
        tasks=test_time_tasks,
        run_dir=run_dir,
    shell:
        "stateloop eval {params.run_dir:q} --depths {params.depths} --config {params.config:q} --no-progress > {log:q} 2>&1"
