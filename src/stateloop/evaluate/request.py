"""``stateloop eval``'s request apart from its stage (evaluate/stage.py), which imports torch and lm-eval."""

from __future__ import annotations

from stateloop.config import Bool, Int, StageRequest, Text, arg
from stateloop.run_ids import RUN_HELP


class Request(StageRequest):
    """One evaluation as asked for (``stateloop eval``'s flags; None: the eval settings of the run's
    scale, resolve.py)."""

    run: Text = arg(RUN_HELP, positional=True, metavar="RUN")
    config: Text | None = arg("pipeline config whose scale's `eval:` section to use (configs/*.yaml)", None)
    tasks: list[Text] | None = arg("lm-eval task names (local ones from workflow/tasks/); none: perplexity only", None)
    shots: list[Int] | None = arg("few-shot counts, e.g. --shots 0 5", None, nargs="+")
    limit: Int | None = arg("at most N documents per task (quick runs)", None)
    batch_size: Int | None = arg("sequences per forward pass", None)
    device: Text | None = arg("auto, cpu, cuda, cuda:N", None)
    depths: list[Int] | None = arg("test-time loop depths: evaluate the run at each -> eval_depth.json", None, nargs="+", metavar="K")
    overrides: list[Text] = arg("other eval settings, e.g. eval.heldout_windows=50", [], name="--set", metavar="eval.KEY=VALUE")
    no_mlflow: Bool = arg("do not log to MLflow", False)
    no_progress: Bool = arg("no progress output", False)
