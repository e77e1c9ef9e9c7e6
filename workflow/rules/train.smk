rule train:
    input:
        meta=data_meta,
    output:
        model=run_path(FINAL_WEIGHTS),
        summary=run_path("train.json"),
    log:
        run_log("train"),
    conda:
        "../../envs/stateloop.yaml"
    threads: job_threads("train")
    resources:
        **job_resources("train"),  # common.smk: train_resources
    params:
        config=job_config,
        model=run_settings,
        train=settings("train"),
        launcher=launcher,
        run=run_id,
        run_dir=run_dir,
    # The data folder is the input's (common.smk: DATA_HOME; another scale's where its tokens are
    # the same). A job reruns when its settings change (params), and Snakemake has deleted model.pt and
    # train.json by then: --restart-on-change makes the training start afresh, saying so, where the
    # folder's checkpoints cannot continue under the new settings (instead of refusing them).
    # Snakemake removes {log} before every attempt (a retry, a requeued SLURM job): the run
    # folder's train.log keeps the lines of every attempt, and {log} starts with them. The tee
    # ignores SIGTERM (SLURM sends it to the whole job on requeue or preemption), so that it keeps
    # what training prints while it writes its checkpoint.
    shell:
        "touch {params.run_dir:q}/train.log && cat {params.run_dir:q}/train.log > {log:q} &&"
        ' {params.launcher} stateloop train --config {params.config:q} {params.run:q} --data-dir "$(dirname {input.meta:q})"'
        " --out {params.run_dir:q} --no-progress --restart-on-change 2>&1 | (trap '' TERM; exec tee -a {params.run_dir:q}/train.log) >> {log:q}"
