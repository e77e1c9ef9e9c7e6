#!/usr/bin/env bash
# The main job: set up the environment if needed, then run the Snakemake DAG. With no arguments,
# every table and figure at the tiny scale (configs/tiny.yaml: offline, CPU). Arguments go to
# snakemake, e.g. `bash scripts/run.sh figures/loop_depth.pdf` or
# `bash scripts/run.sh --profile slurm results/table1.csv`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${STATELOOP_VENV:-.venv}
[ -x "$VENV/bin/stateloop" ] || bash scripts/setup.sh
export PATH="$PWD/$VENV/bin:$PATH"
exec snakemake "$@"
