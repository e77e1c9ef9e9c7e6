"""``stateloop eval``'s request apart from its stage (evaluate/stage.py), which imports torch and lm-eval."""

from __future__ import annotations

from stateloop.config import StageRequest, arg
from stateloop.pipeline import RUN_HELP


class Request(StageRequest):
    """One evaluation as asked for (``stateloop eval``'s flags; None: the eval settings of the run's
    scale, resolve.py)."""

    run: str = arg(RUN_HELP, positional=True, metavar="RUN")
    config: str | None = arg("pipeline config whose scale's `eval:` section to use (configs/*.yaml)", None)
    tasks: list[str] | None = arg("lm-eval task names (local ones from workflow/tasks/); none: perplexity only", None)
    shots: list[int] | None = arg("few-shot counts, e.g. --shots 0 5", None, nargs="+")
    limit: int | None = arg("at most N documents per task (quick runs)", None)
    batch_size: int | None = arg("sequences per forward pass", None)
    device: str | None = arg("auto, cpu, cuda, cuda:N", None)
    depths: list[int] | None = arg("test-time loop depths: evaluate the run at each -> eval_depth.json", None, nargs="+", metavar="K")
    overrides: list[str] = arg("other eval settings, e.g. eval.heldout_windows=50", [], name="--set", metavar="eval.KEY=VALUE")
    no_mlflow: bool = arg("do not log to MLflow", False)
    no_progress: bool = arg("no progress output", False)
