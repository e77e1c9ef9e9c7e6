"""One module per ``stateloop`` command: ``add_arguments(parser)`` and ``run(args)``. Building the
parser imports no torch, lightning, mlflow or lm-eval (the heavy imports sit inside ``run``)."""

from stateloop.pipeline import RUN_ID_EXAMPLE, RUN_ID_FORM, RUNS_ROOT

# RUN in every command that addresses runs (train, eval, analyze, bench decode --runs); decided by
# runs.resolve_run_arg.
RUN_HELP = f"a run folder, or a run id {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}; its folder {RUNS_ROOT}/<id>)"
