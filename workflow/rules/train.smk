def train_res(wc):
    return PIPE.scales[wc.scale].train


def uses_gpu(wc):
    return train_res(wc).accelerator in ("cuda", "gpu")


def launcher(wc, resources):
    """Several nodes: srun starts one task per device and Fabric reads SLURM's variables.
    One node: Fabric starts its own processes, so no launcher."""
    if not resources.get("mpi"):
        return ""
    return (f"{resources.mpi} --nodes={resources.nodes} --ntasks-per-node={resources.tasks_per_node}"
            f" --cpus-per-task={resources.cpus_per_task}")


def train_resources(wc):
    t, res = train_res(wc), stage(wc.scale, "train")
    out = {"runtime": res.runtime, "mem_mb": res.mem_mb, "cpus_per_task": res.cpus_per_task}
    if uses_gpu(wc):
        out.update(gres=f"gpu:{t.devices}", tasks_per_gpu=0)  # tasks_per_gpu=0: see ecosystem.md 1.2
    if t.num_nodes > 1:
        out.update(nodes=t.num_nodes, mpi="srun", tasks_per_node=t.devices)
    return out


rule train:
    input:
        "data/{scale}/meta.json",
    output:
        model="results/runs/{scale}/{model}/K{K}_ds{ds}/model.pt",
        summary="results/runs/{scale}/{model}/K{K}_ds{ds}/train.json",
    log:
        "logs/train/{scale}/{model}/K{K}_ds{ds}.log",
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
        launcher=launcher,
        run=lambda wc: f"{wc.scale}/{wc.model}/K{wc.K}_ds{wc.ds}",
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "{params.launcher} stateloop train --config {CONFIGFILE} --run {params.run} --data-dir data/{wildcards.scale}"
        " --out results/runs/{params.run} --no-progress > {log} 2>&1"
