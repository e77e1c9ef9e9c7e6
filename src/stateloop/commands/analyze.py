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

from stateloop.analysis.request import Request
from stateloop.commands import add_flags
from stateloop.pipeline import load_pipeline

ANALYSES = {"shapley": "exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
            "interventions": "calibrated state replacement and freezing (Figure 4b, eq. 15)"}


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    for name, help_text in ANALYSES.items():
        add_flags(sub.add_parser(name, help=help_text, description=help_text), Request, only=name)


def run(request: Request) -> int:
    from stateloop.analysis.stage import analyze  # lazy: torch

    return analyze(request, load_pipeline(request.config) if request.config else None)
