def eval_tasks(wc):
    """Runs of Tables 1-2 get the configured lm-eval tasks; the others only need held-out PPL."""
    run = RUNS[f"{wc.scale}/{wc.model}/K{wc.K}_ds{wc.ds}"]
    return "" if "table1" in run.experiments else "--tasks"


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
        tasks=eval_tasks,
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop eval results/runs/{wildcards.scale}/{wildcards.model}/K{wildcards.K}_ds{wildcards.ds}"
        " --config {CONFIGFILE} {params.tasks} --quiet > {log} 2>&1"
