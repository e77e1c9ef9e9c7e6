rule eval:
    input:
        run_path("model.pt"),
    output:
        run_path("eval.json"),
    log:
        run_log("eval"),
    threads: lambda wc: stage(wc.scale, "eval").cpus_per_task
    resources:
        runtime=lambda wc: stage(wc.scale, "eval").runtime,
        mem_mb=lambda wc: stage(wc.scale, "eval").mem_mb,
        cpus_per_task=lambda wc: stage(wc.scale, "eval").cpus_per_task,
        gpu=lambda wc: stage(wc.scale, "eval").gpus,
    params:
        config=job_config,
        eval=settings("eval"),
        tasks=eval_tasks,
        run_dir=run_dir,
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop eval {params.run_dir:q}"
        " --config {params.config} {params.tasks} --no-progress > {log} 2>&1"
