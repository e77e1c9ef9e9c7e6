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


# An experiment's own comparison (common.smk: COMPARED): each model's held-out PPL per seed and its
# paired change against the experiment's baseline, with the 95% interval and verdict of Table 1's
# claims; and where the experiment varies K, the same in Figure 2's form.
rule render_comparison:
    input:
        render_inputs,
    output:
        csv=_comparison("results/compare_{experiment}.csv", "CSV"),  # outputs.comparison_files
        md=_comparison("results/compare_{experiment}.md", "Markdown"),
    log:
        "logs/render/compare_{experiment}.log",
    wildcard_constraints:
        experiment=one_of(COMPARED),
    localrule: True
    conda:
        "../../envs/stateloop.yaml"
    params:
        config=job_config,
        reads=render_settings,  # the config sections the output reads
        facts=report_facts,
    shell:
        "stateloop render compare --experiment {wildcards.experiment:q} --config {params.config:q} --out {output.csv:q} > {log:q} 2>&1"


rule render_comparison_figure:
    input:
        render_inputs,
    output:
        pdf=_comparison("figures/compare_{experiment}.pdf", "PDF"),
        png=_comparison("figures/compare_{experiment}.png", "PNG"),
    log:
        "logs/render/compare_{experiment}_figure.log",
    wildcard_constraints:
        experiment=one_of(COMPARED_BY_K),
    localrule: True
    conda:
        "../../envs/stateloop.yaml"
    params:
        config=job_config,
        reads=render_settings,  # the config sections the output reads
        facts=report_facts,
    shell:
        "stateloop render compare --experiment {wildcards.experiment:q} --config {params.config:q} --out {output.pdf:q} > {log:q} 2>&1"
