"""``stateloop eval RUN``: held-out perplexity and lm-eval tasks for one trained run.

The eval settings: the ``eval`` section of the run's scale in ``--config`` (default: the pipeline
config the run was trained from, as its resolved config records), else EvalConfig's defaults (the
paper's tasks at 0 and 5 shots); then ``--set eval.key=value`` overrides and the dedicated flags
(``--tasks``, ``--shots``, ``--limit``, ...). A run that ``--config`` plans scores its tasks only
where the DAG needs them (``pipeline.Run.scores_tasks``: Tables 1-2's runs; at ``--depths``, an
experiment's ``test_time_tasks``), else only its held-out perplexity, unless the tasks are named.
The model itself always comes from the run folder.
The settings that name code or files (``eval.task_dir``, ``eval.task_data``) and the MLflow store
come only from ``--config`` and ``--set``: a run folder is data, never code (resolve.py).

Writes eval.json (atomically) and eval_samples/ into the run folder, and logs to the run's MLflow run.

Test-time depth (this project's study, not the paper's protocol): ``--set eval.K=8`` evaluates the
trained weights at K' = 8 loop iterations into eval_K8.json; ``--depths 1 2 ... 8`` measures each
depth from one load of the weights into eval_depth.json (held-out perplexity, and the tasks of the
eval settings unless ``--tasks`` names none).
"""

from __future__ import annotations

from stateloop.evaluate.request import Request


def run(request: Request) -> int:
    from stateloop.evaluate.stage import eval_stage  # lazy: torch, lm-eval

    return eval_stage(request)  # the stage loads --config
