"""``stateloop analyze {shapley,interventions} RUN_DIR``: the Figure 4 analyses of a trained run.

- ``shapley``: held-out NLL of all 2^K masks of the state reads R_1..R_K and each read's exact
  Shapley value and share -> RUN_DIR/shapley.json (analysis/shapley.py).
- ``interventions``: per-channel state statistics from a calibration split, then held-out PPL
  under calibrated single replacement and freezing at every boundary (eq. 15) ->
  RUN_DIR/interventions.json and RUN_DIR/interventions_calibration.pt (analysis/interventions.py).

Both read the model and its token shards from the run folder (``data.dir`` of its config), use
consecutive windows of the run's training context length from the start of a split, and log to
MLflow: into the training run that RUN_DIR/train.json names, else into the run named by the run
id in the training experiment (as ``stateloop eval`` does).
"""

from __future__ import annotations

import sys
from pathlib import Path


def _common(p) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a trained run folder (results/runs/...)")
    p.add_argument("--seq-len", type=int, help="window length (default: the run's train.seq_len, else model.max_seq_len)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="evaluation precision (default float32)")
    p.add_argument("--output", help="result JSON (default: in RUN_DIR)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    s = sub.add_parser("shapley", help="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
                       description="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)")
    _common(s)
    s.add_argument("--split", default="test", help="held-out split evaluated (default: test)")
    s.add_argument("--max-windows", type=int, default=128, help="windows evaluated (default 128; 0: the whole split)")
    i = sub.add_parser("interventions", help="calibrated state replacement and freezing (Figure 4b, eq. 15)",
                       description="calibrated state replacement and freezing (Figure 4b, eq. 15)")
    _common(i)
    i.add_argument("--calib-split", default="val", help="split the state statistics come from (default: val)")
    i.add_argument("--calib-windows", type=int, default=64, help="calibration windows (default 64; 0: the whole split)")
    i.add_argument("--eval-split", default="test", help="split the perplexities are measured on (default: test)")
    i.add_argument("--max-windows", type=int, default=128, help="evaluation windows (default 128; 0: the whole split)")


def run(args) -> int:
    from stateloop.analysis import common
    from stateloop.analysis.latency import DTYPES
    from stateloop.config import ConfigError
    from stateloop.runs import atomic_torch_save, atomic_write_json, code_version, load_model, resolve_device

    device = resolve_device(args.device)
    model, config = load_model(args.run_dir, device=device)
    model = model.to(DTYPES[args.dtype])
    common.require_reads(model, f"analyze {args.analysis}")
    seq_len = args.seq_len or common.run_seq_len(config, model)
    progress = not args.no_progress
    settings = {"seq_len": seq_len, "batch_size": args.batch_size, "dtype": args.dtype, "device": str(device)}
    run_dir = Path(args.run_dir)

    if args.analysis == "shapley":
        from stateloop.analysis.shapley import shapley_analysis

        windows = common.run_windows(config, run_dir, args.split, seq_len, args.max_windows or None)
        print(f"analyze shapley: {run_dir}, {2 ** model.cfg.K} masks x {len(windows)} windows of {seq_len} "
              f"tokens ({args.split})", file=sys.stderr)
        result = shapley_analysis(model, windows, args.batch_size, device, progress)
        settings.update(split=args.split, windows=len(windows))
        metrics = {"nll_none_masked": result["nll_none_masked"], "nll_all_masked": result["nll_all_masked"],
                   "feedback_share_pct": result["feedback_share_pct"], "terminal_share_pct": result["terminal_share_pct"],
                   **{f"phi_R{k + 1}": v for k, v in enumerate(result["shapley"])},
                   **{f"share_pct_R{k + 1}": v for k, v in enumerate(result["share_pct"])}}
        summary = (f"feedback reads {result['feedback_share_pct']:.2f}%, terminal read {result['terminal_share_pct']:.2f}% "
                   f"(paper, K=7: 63.70% / 36.30%)")
    else:
        from stateloop.analysis.interventions import intervention_analysis

        if args.calib_split == args.eval_split:
            raise ConfigError(f"--calib-split: the calibration sample must be separate from the evaluation data "
                              f"(both are {args.eval_split!r})")
        calib = common.run_windows(config, run_dir, args.calib_split, seq_len, args.calib_windows or None)
        windows = common.run_windows(config, run_dir, args.eval_split, seq_len, args.max_windows or None)
        print(f"analyze interventions: {run_dir}, calibration {len(calib)} windows ({args.calib_split}), "
              f"evaluation {len(windows)} windows ({args.eval_split}) of {seq_len} tokens", file=sys.stderr)
        result, stats = intervention_analysis(model, calib, windows, args.batch_size, device, progress)
        stats_path = run_dir / "interventions_calibration.pt"
        atomic_torch_save({"mean": stats.mean, "std": stats.std, "tokens": stats.tokens,
                           "split": args.calib_split}, stats_path)
        settings.update(calib_split=args.calib_split, calib_windows=len(calib), eval_split=args.eval_split,
                        windows=len(windows), calibration_file=stats_path.name)
        metrics = {"ppl_unmodified": result["unmodified"]["ppl"],
                   **{f"ppl_replace_{e['i']}": e["ppl"] for e in result["replacement"]},
                   **{f"ppl_freeze_{e['i']}": e["ppl"] for e in result["freezing"]}}
        summary = "PPL unmodified {:.3f}; replace {}; freeze {}".format(
            result["unmodified"]["ppl"], ", ".join(f"S{e['replaced']}<-S{e['i']}: {e['ppl']:.3f}" for e in result["replacement"]),
            ", ".join(f"at S{e['i']}: {e['ppl']:.3f}" for e in result["freezing"]))

    out = Path(args.output) if args.output else run_dir / f"{args.analysis}.json"
    result = {"analysis": args.analysis, "run_dir": str(run_dir), "model": model.cfg.name, "settings": settings,
              "code_version": code_version(), **result}
    atomic_write_json(out, result)
    print(summary)
    print(f"wrote {out}", file=sys.stderr)
    if not args.no_mlflow:
        mlflow_id = common.log_to_mlflow(run_dir, config, args.analysis, metrics, settings, out)
        print(f"logged to MLflow run {mlflow_id}", file=sys.stderr)
    return 0
