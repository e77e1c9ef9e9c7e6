"""``stateloop eval RUN``: held-out perplexity and lm-eval tasks for one trained run.

The eval settings: the ``eval`` section of the run's scale in ``--config`` (default: the config
the run was trained from), then ``--set`` and the dedicated flags (resolve.py). A planned run
scores its tasks only where the DAG needs them (``pipeline.Run.scores_tasks``) unless they are
named; the model always comes from the run folder.

Writes eval.json (atomically) and eval_samples/ into the run folder, and logs to the run's MLflow run.

Test-time depth (this project's study, not the paper's protocol): ``--set eval.K=8`` evaluates the
trained weights at K' = 8 loop iterations into eval_K8.json; ``--depths 1 2 ... 8`` measures each
depth from one load of the weights into eval_depth.json (held-out perplexity, and the tasks of the
eval settings unless ``--tasks`` names none).
"""

from __future__ import annotations

from stateloop.evaluate.request import Request
from stateloop.ops.cluster import check_cluster_file


def run(request: Request) -> int:
    check_cluster_file(request.config)
    from stateloop.evaluate.stage import eval_stage  # lazy: torch, lm-eval

    return eval_stage(request)  # the stage loads --config
