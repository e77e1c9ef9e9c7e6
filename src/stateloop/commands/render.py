"""``stateloop render TARGET --config CONFIG --out PATH``: one table or figure from the results.

Tables (table1..table4) and the claims (``claims``: the paper's claims judged, report/claims.py)
write PATH (.csv) and its Markdown twin (.md); figures (loop_depth, state_width, state_analysis)
write PATH (.pdf) and its PNG twin (.png). Both atomically.

Both files are also logged to MLflow, as artifacts under TARGET/ of the config's report run: one
run per pipeline config file content (the DAG's results/configs/<digest>.yaml), named
``report/<scales>``, in the first scale's ``train.mlflow_experiment``, in ``$MLFLOW_TRACKING_URI``,
else the first ``train.mlflow_tracking_uri`` the scales set, else results/mlflow.db. Every render
of one config adds to the same run; ``--no-mlflow`` skips it.
"""

from __future__ import annotations

from stateloop.report.outputs import BENCH_FILE, OUTPUTS


def add_arguments(p) -> None:
    p.add_argument("target", choices=list(OUTPUTS), help="what to render (stateloop.report.outputs)")
    p.add_argument("--config", required=True, help="pipeline config (configs/*.yaml)")
    p.add_argument("--out", required=True, help="output path: results/<table>.csv, results/claims.csv or figures/<figure>.pdf")
    p.add_argument("--results", default="results", help="results folder holding runs/ and bench/ (default: results)")
    p.add_argument("--bench", help=f"decode benchmark JSON for table3 (default: RESULTS/{BENCH_FILE})")
    p.add_argument("--no-mlflow", action="store_true", help="do not log the files to MLflow")


def run(args) -> int:
    import io
    from pathlib import Path

    from stateloop.pipeline import load_pipeline
    from stateloop.runs import atomic_write_bytes

    cfg = load_pipeline(args.config)
    results, out = Path(args.results), Path(args.out)
    kind = OUTPUTS[args.target].kind
    if kind == "claims":
        from stateloop.report import claims

        df = claims.judge(cfg, results)
        atomic_write_bytes(out, df.to_csv(index=False, float_format="%.4f").encode())
        atomic_write_bytes(out.with_suffix(".md"), claims.to_markdown(df, cfg, str(args.config)).encode())
        written = [out, out.with_suffix(".md")]
    elif kind == "table":
        from stateloop.report import tables

        kwargs = {"bench_json": Path(args.bench)} if OUTPUTS[args.target].bench and args.bench else {}
        df, notes = tables.TABLES[args.target](cfg, results, **kwargs)
        atomic_write_bytes(out, df.to_csv(index=False, float_format="%.4f").encode())
        atomic_write_bytes(out.with_suffix(".md"), tables.to_markdown(df, notes, OUTPUTS[args.target].title).encode())
        written = [out, out.with_suffix(".md")]
    else:
        import matplotlib.pyplot as plt

        from stateloop.report import figures

        fig = figures.FIGURES[args.target](cfg, results)
        for path, fmt in ((out, "pdf"), (out.with_suffix(".png"), "png")):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt)  # PNG at style.RC["savefig.dpi"]
            atomic_write_bytes(path, buf.getvalue())
        plt.close(fig)
        written = [out, out.with_suffix(".png")]
    print(f"stateloop render: wrote {out}")
    if not args.no_mlflow:
        print(f"stateloop render: logged to MLflow run {log_to_mlflow(cfg, args.config, args.target, written)}")
    return 0


def log_to_mlflow(cfg, config_file, target: str, paths) -> str:
    """Log rendered files as artifacts under TARGET/ of the config's report run (found by the
    sha256 of the config file, made once, closed FINISHED after each render). Returns its id."""
    import hashlib
    from pathlib import Path

    from stateloop.tracking import client, named_run, standard_tags, tracking_uri

    digest = hashlib.sha256(Path(config_file).read_bytes()).hexdigest()[:16]
    first = next(iter(cfg.scales.values()))
    c = client(tracking_uri(*(s.train.mlflow_tracking_uri for s in cfg.scales.values())))
    tags = {"report_config": digest, "config_file": str(config_file), "scales": ",".join(cfg.scales),
            **standard_tags("render")}
    run_id = named_run(c, first.train.mlflow_experiment, f"tags.report_config = '{digest}'",
                       f"report/{'+'.join(cfg.scales)}", tags)
    for path in paths:
        c.log_artifact(run_id, str(path), artifact_path=target)
    c.set_terminated(run_id, "FINISHED")
    return run_id
