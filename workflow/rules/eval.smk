rule eval:
    input:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/model.pt",
    output:
        "results/runs/{scale}/{model}/K{K}_ds{ds}/eval.json",
    log:
        "logs/eval/{scale}/{model}/K{K}_ds{ds}.log",
    threads: lambda wc: stage(wc.scale, "eval").cpus_per_task
    resources:
        runtime=lambda wc: stage(wc.scale, "eval").runtime,
        mem_mb=lambda wc: stage(wc.scale, "eval").mem_mb,
        cpus_per_task=lambda wc: stage(wc.scale, "eval").cpus_per_task,
        gpu=lambda wc: stage(wc.scale, "eval").gpus,
    params:
        config=CONFIGFILE,
        eval=settings("eval"),
        tasks=eval_tasks,
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop eval results/runs/{wildcards.scale}/{wildcards.model}/K{wildcards.K}_ds{wildcards.ds}"
        " --config {params.config} {params.tasks} --quiet > {log} 2>&1"
