rule render_table:
    input:
        lambda wc: (["results/bench/decode.json"] if wc.table == "table3"
                    else run_files(STAGE_EXPERIMENTS[wc.table], "eval.json")),
    output:
        csv="results/{table}.csv",
        md="results/{table}.md",
    log:
        "logs/render/{table}.log",
    wildcard_constraints:
        table="table1|table2|table3|table4",
    params:
        config=CONFIG_DIGEST,  # cheap jobs: any change of the config redoes them
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop render {wildcards.table} --config {CONFIGFILE} --out {output.csv} > {log} 2>&1"


rule render_figure:
    input:
        figure_inputs,
    output:
        pdf="figures/{figure}.pdf",
        png="figures/{figure}.png",
    log:
        "logs/render/{figure}.log",
    wildcard_constraints:
        figure="loop_depth|state_width|state_analysis",
    params:
        config=CONFIG_DIGEST,  # cheap jobs: any change of the config redoes them
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop render {wildcards.figure} --config {CONFIGFILE} --out {output.pdf} > {log} 2>&1"


# The paper's claims, each with our effect, its 95% confidence interval over seeds and a verdict.
rule render_claims:
    input:
        claims_inputs,
    output:
        md="results/claims.md",
        csv="results/claims.csv",
    log:
        "logs/render/claims.log",
    params:
        config=CONFIG_DIGEST,  # cheap jobs: any change of the config redoes them
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop render claims --config {CONFIGFILE} --out {output.csv} > {log} 2>&1"
