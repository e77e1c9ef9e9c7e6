"""``stateloop analyze {shapley,interventions} RUN``: the Figure 4 analyses of a trained run.

RUN: a run folder (RUN_DIR below) or a run id.

- ``shapley``: held-out NLL of all 2^K masks of the state reads R_1..R_K and each read's exact
  Shapley value and share -> RUN_DIR/shapley.json (analysis/shapley.py).
- ``interventions``: per-channel state statistics from a calibration sample, then held-out PPL
  under calibrated single replacement and freezing at every boundary (eq. 15) ->
  RUN_DIR/interventions.json and RUN_DIR/interventions_calibration.pt (analysis/interventions.py).

The held-out windows are those of the run's held-out perplexity (``stateloop eval``), so all
analyses share Table 4's baseline (a flag that changes them leaves ``matches_eval_protocol:
false`` in the JSON); the calibration windows are a seeded sample of the ``train`` split
(analysis/common.py).

``--shard I/N`` evaluates shard I of N of the windows and ``--merge N`` adds the shards' exact
sums: bit for bit the unsharded analysis; partial sums are kept in RUN_DIR/analysis_shards/, so a
job stopped at its time limit resumes (analysis/shards.py). Each JSON's ``heldout`` block equals
eval.json's; results are logged to the run's MLflow training run, one metric per read or boundary
over steps (``shapley/phi`` at step k for R_k, ``interventions/ppl_replace`` at step i for S_i).
"""

from __future__ import annotations

from stateloop.analysis.request import Request
from stateloop.experiments import load_checked
from stateloop.ops.cluster import check_cluster_file

SUBCOMMANDS = {"shapley": "exact Shapley values of the K state reads over all 2^K masks (Figure 4a)",
               "interventions": "calibrated state replacement and freezing (Figure 4b, eq. 15)"}


def run(request: Request) -> int:
    check_cluster_file(request.config)
    from stateloop.analysis.stage import analyze  # lazy: torch

    return analyze(request, load_checked(request.config, expand=False)[0] if request.config else None)
