# stateloop-repro: one DAG from tokens to every table and figure of the paper.
#   snakemake --cores 2                             the tiny offline pipeline (configs/tiny.yaml)
#   snakemake --configfile configs/smoke.yaml ...   the smaller DAG the tests run
#   snakemake --profile slurm results/table1.csv    the paper (configs/paper.yaml) on SLURM
#   snakemake --report report.html                  every table, figure and the claims in one file
# Every job is one `stateloop` command; the rules only wire files together.
import os

from snakemake.utils import min_version

min_version("9.0")

# --software-deployment-method conda: envs/stateloop.yaml installs this checkout (`-e
# ${STATELOOP_ROOT}`, which pip expands), wherever Snakemake copies the file and whatever
# --directory is: conda runs pip in .snakemake/conda/, so a relative path would miss it.
os.environ.update(STATELOOP_ROOT=workflow.basedir)


report: "workflow/report/workflow.rst"


# The default config applies only when none is given: Snakemake would otherwise merge the two.
if not workflow.overwrite_configfiles:

    configfile: "configs/tiny.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/export.smk"


rule all:
    default_target: True
    input:
        TABLES,
        FIGURES,
        CLAIMS,
        COMPARISONS,
