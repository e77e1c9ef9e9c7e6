# Rendering: the tables, figures and claims from the runs' JSON results. Each output is marked for
# `snakemake --report report.html` (one self-contained file: every table, figure and the claims,
# each with a caption from workflow/report/ naming its scale, its seeds and what it compares).
# The render jobs take seconds: `localrule: True` runs them on the host of the main Snakemake
# process (no SLURM job is queued for them under --profile slurm).


include: "../report/captions.smk"


rule render_table:
    input:
        render_inputs,
    output:
        csv=_table("results/{table}.csv", "CSV"),  # OUTPUTS[table].files
        md=_table("results/{table}.md", "Markdown"),
    log:
        "logs/render/{table}.log",
    wildcard_constraints:
        table="|".join(of_kind("table")),
    localrule: True
    conda:
        "../../envs/stateloop.yaml"
    params:
        config=job_config,
        reads=render_settings,  # the config sections the output reads
        facts=report_facts,
    shell:
        "stateloop render {wildcards.table:q} --config {params.config:q} --out {output.csv:q} > {log:q} 2>&1"


rule render_figure:
    input:
        render_inputs,
    output:
        pdf=_figure("figures/{figure}.pdf", "PDF"),
        png=_figure("figures/{figure}.png", "PNG"),
    log:
        "logs/render/{figure}.log",
    wildcard_constraints:
        figure="|".join(of_kind("figure")),
    localrule: True
    conda:
        "../../envs/stateloop.yaml"
    params:
        config=job_config,
        reads=render_settings,  # the config sections the output reads
        facts=report_facts,
    shell:
        "stateloop render {wildcards.figure:q} --config {params.config:q} --out {output.pdf:q} > {log:q} 2>&1"


# The paper's claims, each with our effect, its 95% confidence interval over seeds and a verdict.
rule render_claims:
    input:
        render_inputs,
    output:
        md=_claims("results/claims.md", "Markdown"),
        csv=_claims("results/claims.csv", "CSV"),
    log:
        "logs/render/claims.log",
    localrule: True
    conda:
        "../../envs/stateloop.yaml"
    params:
        config=job_config,
        reads=render_settings,  # the config sections the output reads
        facts=report_facts,
    shell:
        "stateloop render claims --config {params.config:q} --out {output.csv:q} > {log:q} 2>&1"
