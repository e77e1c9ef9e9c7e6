rule train:
    input:
        "data/{scale}/meta.json",
    output:
        model=run_path("model.pt"),
        summary=run_path("train.json"),
    log:
        run_log("train"),
    threads: lambda wc: stage(wc.scale, "train").cpus_per_task
    resources:
        runtime=lambda wc: train_resources(wc)["runtime"],
        mem_mb=lambda wc: train_resources(wc)["mem_mb"],
        cpus_per_task=lambda wc: train_resources(wc)["cpus_per_task"],
        gres=lambda wc: train_resources(wc).get("gres", ""),
        tasks_per_gpu=lambda wc: train_resources(wc).get("tasks_per_gpu", 1),
        nodes=lambda wc: train_resources(wc).get("nodes", 1),
        # One SLURM task per device: tasks_per_node, or tasks (one per node) where a node has one.
        tasks_per_node=lambda wc: train_resources(wc).get("tasks_per_node", 0),
        tasks=lambda wc: train_resources(wc).get("tasks", 0),
        # Always present, so the SLURM job step runs the command in the batch script itself, where
        # {params.launcher} starts training as a job step (srun); "srun" (several tasks) makes
        # the plugin ask for the tasks.
        mpi=lambda wc: train_resources(wc).get("mpi", ""),
        # SLURM's warning before the time limit (to job steps), the log of every attempt.
        slurm_extra=lambda wc: train_resources(wc)["slurm_extra"],
    params:
        config=job_config,
        model=run_settings,
        train=settings("train"),
        launcher=launcher,
        run=lambda wc: run_of(wc).id,
        run_dir=run_dir,
    conda:
        "../../envs/stateloop.yaml"
    # Snakemake removes {log} before every attempt (a retry, a requeued SLURM job): the run
    # folder's train.log keeps the lines of every attempt, and {log} starts with them. The tee
    # ignores SIGTERM (SLURM sends it to the whole job on requeue or preemption), so that it keeps
    # what training prints while it writes its checkpoint.
    shell:
        "touch {params.run_dir:q}/train.log && cat {params.run_dir:q}/train.log > {log} &&"
        " {params.launcher} stateloop train --config {params.config} {params.run:q} --data-dir data/{wildcards.scale:q}"
        " --out {params.run_dir:q} --no-progress 2>&1 | (trap '' TERM; exec tee -a {params.run_dir:q}/train.log) >> {log}"
