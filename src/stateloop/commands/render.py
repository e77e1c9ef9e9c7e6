"""``stateloop render TARGET --config CONFIG --out PATH``: one table or figure from the results.

Tables (table1..table4) and the claims (``claims``: the paper's claims judged, report/claims.py)
write PATH (.csv) and its Markdown twin (.md); figures (loop_depth, state_width, state_analysis)
write PATH (.pdf) and its PNG twin (.png). Both atomically. ``compare --experiment NAME``: that
experiment's own comparison (report/compare.py), its table (PATH .csv) or its figure (PATH .pdf).

Both files are also logged to MLflow under TARGET/ of the config's report run (one run per
config file content, report/render.py); ``--no-mlflow`` skips it.
"""

from __future__ import annotations

from pathlib import Path

from stateloop.config import Bool, ConfigError, StageRequest, Text, arg
from stateloop.experiments import load_pipeline
from stateloop.ops.cluster import check_cluster
from stateloop.ops.measured import keep_flop_counts
from stateloop.report.outputs import BENCH_FILE, COMPARE, OUTPUTS
from stateloop.report.render import render


class Request(StageRequest):
    target: Text = arg("what to render (stateloop.report.outputs); compare: an experiment's own comparison (--experiment)",
                      positional=True, choices=[*OUTPUTS, COMPARE])
    config: Text = arg("pipeline config (configs/*.yaml)")
    out: Text = arg("output path: results/<table>.csv, results/claims.csv or figures/<figure>.pdf")
    results: Text = arg("results folder holding runs/ and bench/ (default: results)", "results")
    bench: Text | None = arg(f"decode benchmark JSON for table3 (default: RESULTS/{BENCH_FILE})", None)
    no_mlflow: Bool = arg("do not log the files to MLflow", False)
    experiment: Text | None = arg("compare only: the experiment whose comparison to render (--out results/compare_NAME.csv "
                                 "for its table, figures/compare_NAME.pdf for its figure where it varies K)", None)


def run(args: Request) -> int:
    if (args.target == COMPARE) != (args.experiment is not None):
        raise ConfigError("--experiment: give it with target compare, and only then")
    cfg = load_pipeline(args.config)
    check_cluster(cfg, args.config)
    keep_flop_counts()  # table 1's FLOP counts: counted once per shape, across processes too
    return render(cfg, args.config, args.target, Path(args.results), Path(args.out),
                  Path(args.bench) if args.bench else None, mlflow=not args.no_mlflow, experiment=args.experiment)
