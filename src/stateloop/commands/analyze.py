"""``stateloop analyze {shapley,interventions} RUN``: the Figure 4 analyses of a trained run.

RUN: a run folder (RUN_DIR below) or a run id, as in every command that addresses runs
(runs.resolve_run_arg).

- ``shapley``: held-out NLL of all 2^K masks of the state reads R_1..R_K and each read's exact
  Shapley value and share -> RUN_DIR/shapley.json (analysis/shapley.py).
- ``interventions``: per-channel state statistics from a calibration sample, then held-out PPL
  under calibrated single replacement and freezing at every boundary (eq. 15) ->
  RUN_DIR/interventions.json and RUN_DIR/interventions_calibration.pt (analysis/interventions.py).

Held-out data: exactly that of the run's held-out perplexity (``stateloop eval``, Table 4), so
that all analyses share Table 4's unmodified baseline (the paper: 9.04 at 410M, K = 7): the
``eval`` section of the run's scale in ``--config`` (default: the pipeline config the run was
trained from, as ``stateloop eval``) gives the split (``eval.heldout_split``, default "val"),
the window count (``eval.heldout_windows``, null: the whole split), the window length
(``eval.max_length``, null: the run's ``train.seq_len``), the batch size and the precision.
Windows are consecutive from the start of the split. ``--split`` / ``--eval-split``,
``--max-windows`` (0: the whole split), ``--seq-len``, ``--batch-size`` and ``--dtype`` override
them; the JSON's ``heldout`` block then says ``matches_eval_protocol: false``.

Calibration (interventions): ``--calib-windows`` (default 64) windows of the ``train`` split, a
seeded (``--calib-seed``, default 0) uniform sample of its non-overlapping window slots. train is
in every data folder and disjoint from the held-out split by construction; ``--calib-split``
picks another split, never the evaluated one.

Shards and partial results (analysis/shards.py): ``--shard I/N`` evaluates only shard I of N (a
contiguous run of whole batches of the windows) into RUN_DIR/analysis_shards/<analysis>_<I>of<N>.json,
and ``--merge N`` adds the N shards' exact sums into the analysis JSON: the same numbers, bit for
bit, as the unsharded analysis. The shards of the interventions share one calibration, written
first by ``interventions --calibrate-only``. Every evaluation keeps its partial sums in
RUN_DIR/analysis_shards/ (``--save-every`` seconds apart) and, run again with the same settings,
continues from them: a job stopped at its time limit resumes where it stopped.

Each JSON has a ``heldout`` block with the keys of eval.json's (split, windows, seq_len, tokens,
split_tokens, nll, ppl): the unmodified model's held-out result (all reads kept; no
intervention), equal to eval.json's ``heldout`` for the same run. Results are logged to MLflow:
into the training run that RUN_DIR/train.json names, else into the run named by the run id in
the training experiment (as ``stateloop eval`` does). Per-read and per-boundary values are one
metric each over steps (``shapley/phi`` and ``shapley/share_pct`` at step k for R_k,
``interventions/ppl_replace`` and ``interventions/ppl_freeze`` at step i for S_i).
"""

from __future__ import annotations

from stateloop.commands import RUN_HELP

DTYPE_CHOICES = ["auto", "float32", "bf16-mixed", "bfloat16", "float16"]
SAVE_EVERY = 120.0  # analysis/stage.py's default (not imported: the parser must not import torch)


def _common(p) -> None:
    p.add_argument("run", metavar="RUN", help=f"the trained run: {RUN_HELP}")
    p.add_argument("--config", help="pipeline config whose scale's `eval:` section sets the held-out data "
                                    "(default: the config the run was trained from, as `stateloop eval`)")
    p.add_argument("--seq-len", type=int, help="window length (default: eval.max_length, else the run's train.seq_len)")
    p.add_argument("--batch-size", type=int, help="windows per forward pass (default: eval.batch_size)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="auto (default): eval.precision, as the held-out PPL (32-true: float32; bf16-mixed: "
                        "float32 weights under bfloat16 autocast); bfloat16/float16: cast the weights")
    p.add_argument("--out", help="result JSON (default: in the run folder)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--shard", metavar="I/N",
                   help="evaluate only shard I of N (whole batches of the windows) into RUN_DIR/analysis_shards/")
    p.add_argument("--merge", type=int, metavar="N",
                   help="merge the N finished shards in RUN_DIR/analysis_shards/ into the analysis JSON (exact sums)")
    p.add_argument("--save-every", type=float, default=SAVE_EVERY, metavar="SECONDS",
                   help=f"write the partial sums at most this often (default {SAVE_EVERY:g}; 0: after every batch); "
                        f"a rerun with the same settings continues from them")


def add_arguments(p) -> None:
    from stateloop.analysis.common import CALIB_SEED, CALIB_SPLIT, CALIB_WINDOWS

    sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    s = sub.add_parser("shapley", help="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
                       description="exact Shapley values of the K state reads over all 2^K masks (Figure 4a)")
    _common(s)
    s.add_argument("--split", help="held-out split evaluated (default: eval.heldout_split, as the held-out PPL)")
    s.add_argument("--max-windows", type=int,
                   help="windows evaluated (default: eval.heldout_windows, as the held-out PPL; 0: the whole split)")
    i = sub.add_parser("interventions", help="calibrated state replacement and freezing (Figure 4b, eq. 15)",
                       description="calibrated state replacement and freezing (Figure 4b, eq. 15)")
    _common(i)
    i.add_argument("--calib-split", default=CALIB_SPLIT,
                   help=f"split the state statistics come from (default: {CALIB_SPLIT}, disjoint from the held-out split)")
    i.add_argument("--calib-windows", type=int, default=CALIB_WINDOWS,
                   help=f"calibration windows, a seeded sample over the whole split (default {CALIB_WINDOWS}; 0: every window)")
    i.add_argument("--calib-seed", type=int, default=CALIB_SEED, help=f"seed of the calibration sample (default {CALIB_SEED})")
    i.add_argument("--calibrate-only", action="store_true",
                   help="write the calibration statistics (RUN_DIR/interventions_calibration.pt) and stop: the "
                        "shards of one analysis read them")
    i.add_argument("--eval-split", help="split the perplexities are measured on (default: eval.heldout_split)")
    i.add_argument("--max-windows", type=int,
                   help="evaluation windows (default: eval.heldout_windows, as the held-out PPL; 0: the whole split)")


def run(args) -> int:
    from stateloop.analysis.stage import Request, analyze
    from stateloop.pipeline import load_pipeline

    return analyze(Request.of(args), load_pipeline(args.config) if args.config else None)
