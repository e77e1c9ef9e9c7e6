"""``stateloop analyze {shapley,interventions} RUN``: the Figure 4 analyses of a trained run.

RUN: a run folder (RUN_DIR below) or a run id.

- ``shapley``: held-out NLL of all 2^K masks of the state reads R_1..R_K and each read's exact
  Shapley value and share -> RUN_DIR/shapley.json (analysis/shapley.py).
- ``interventions``: per-channel state statistics from a calibration sample, then held-out PPL
  under calibrated single replacement and freezing at every boundary (eq. 15) ->
  RUN_DIR/interventions.json and RUN_DIR/interventions_calibration.pt (analysis/interventions.py).

Held-out data and calibration sample (interventions): analysis/common.py. The held-out windows
are exactly those of the run's held-out perplexity (``stateloop eval``, Table 4: the ``eval``
section of the run's scale in ``--config``), so all analyses share Table 4's unmodified baseline;
a flag that changes them (``--split``/``--eval-split``, ``--max-windows``, ``--seq-len``,
``--batch-size``, ``--dtype``) leaves the JSON's ``heldout`` block saying
``matches_eval_protocol: false``. The calibration windows are a seeded sample of the ``train``
split, disjoint from the held-out split by construction (``--calib-split``: never the evaluated one).

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
from stateloop.pipeline import load_checked

SUBCOMMANDS = {"shapley": "exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
               "interventions": "calibrated state replacement and freezing (Figure 4b, eq. 15)"}


def run(request: Request) -> int:
    from stateloop.analysis.stage import analyze  # lazy: torch

    return analyze(request, load_checked(request.config, expand=False)[0] if request.config else None)
