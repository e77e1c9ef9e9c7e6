rule train:
    input:
        "data/{scale}/meta.json",
    output:
        model=run_path("model.pt"),
        summary=run_path("train.json"),
    log:
        "logs/train/{scale}/{model}/K{K}_ds{ds}_seed{seed}.log",
    threads: lambda wc: stage(wc.scale, "train").cpus_per_task
    resources:
        runtime=lambda wc: train_resources(wc)["runtime"],
        mem_mb=lambda wc: train_resources(wc)["mem_mb"],
        cpus_per_task=lambda wc: train_resources(wc)["cpus_per_task"],
        gres=lambda wc: train_resources(wc).get("gres", ""),
        tasks_per_gpu=lambda wc: train_resources(wc).get("tasks_per_gpu", 1),
        nodes=lambda wc: train_resources(wc).get("nodes", 1),
        tasks_per_node=lambda wc: train_resources(wc).get("tasks_per_node", 1),
        # Always present, so the SLURM job step runs the command in the batch script itself;
        # "srun" (several nodes) makes the launcher start one task per device.
        mpi=lambda wc: train_resources(wc).get("mpi", ""),
    params:
        config=job_config,
        model=run_settings,
        train=settings("train"),
        launcher=launcher,
        run=lambda wc: run_of(wc).id,
        run_dir=run_dir,
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "{params.launcher} stateloop train --config {params.config} --run {params.run:q} --data-dir data/{wildcards.scale:q}"
        " --out {params.run_dir:q} --no-progress > {log} 2>&1"
