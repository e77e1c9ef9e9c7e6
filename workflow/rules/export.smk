# Hugging Face directories of trained runs (`stateloop export`): results/exports/<run id>/, loadable
# with transformers' AutoModelForCausalLM (trust_remote_code) and scored by stock lm-eval.
#   snakemake exports                                       every trained run of the config
#   snakemake results/exports/tiny/stateloop/K3_ds64_seed1234   one run
EXPORTS_ROOT = "results/exports"


rule export:
    input:
        rules.train.output.model,
    output:
        directory(f"{EXPORTS_ROOT}/{RUN_ID_FORM}"),
    log:
        run_log("export"),
    localrule: True  # reads the weights once and writes them again: no cluster job
    conda:
        "../../envs/stateloop.yaml"
    params:
        run_dir=run_dir,
    shell:
        "stateloop export {params.run_dir:q} --out {output:q} > {log:q} 2>&1"


rule exports:
    input:
        [f"{EXPORTS_ROOT}/{run_id}" for run_id in RUNS],
