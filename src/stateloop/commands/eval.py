"""``stateloop eval RUN``: held-out perplexity and lm-eval tasks for one trained run.

RUN: a run folder or a run id, as in every command that addresses runs (runs.resolve_run_arg).

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

from stateloop.commands import RUN_HELP


def add_arguments(p) -> None:
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument("--config", help="pipeline config whose scale's `eval:` section to use (configs/*.yaml)")
    p.add_argument("--tasks", nargs="*", help="lm-eval task names (local ones from workflow/tasks/); none: perplexity only")
    p.add_argument("--shots", nargs="+", type=int, help="few-shot counts, e.g. --shots 0 5")
    p.add_argument("--limit", type=int, help="at most N documents per task (quick runs)")
    p.add_argument("--batch-size", type=int, help="sequences per forward pass")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--depths", nargs="+", type=int, metavar="K",
                   help="test-time loop depths: evaluate the run at each -> eval_depth.json")
    p.add_argument("--set", nargs="*", default=[], metavar="eval.KEY=VALUE", help="other eval settings, e.g. eval.heldout_windows=50")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--no-progress", action="store_true", help="no progress output")


def run(args) -> int:
    from stateloop.evaluate.stage import Request, eval_stage

    return eval_stage(Request.of(args))  # the stage loads --config
