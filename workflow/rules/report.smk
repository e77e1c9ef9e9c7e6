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
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop render {wildcards.table} --config {CONFIGFILE} --out {output.csv} > {log} 2>&1"


def figure_inputs(wc):
    exp = STAGE_EXPERIMENTS[wc.figure]
    files = run_files(exp, "eval.json")
    if wc.figure == "state_analysis":
        files = run_files(exp, "shapley.json") + run_files(exp, "interventions.json")
    if wc.figure == "state_width":  # the vanilla reference line, when the config trains one
        K = {r.K for r in runs_of(exp)}
        files += [f"{run_dir(r)}/eval.json" for r in RUNS.values() if r.model == "vanilla_looped" and r.K in K]
    return files


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
    conda:
        "../../envs/stateloop.yaml"
    shell:
        "stateloop render {wildcards.figure} --config {CONFIGFILE} --out {output.pdf} > {log} 2>&1"
