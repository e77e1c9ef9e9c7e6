"""``eval:`` section of a scale: what ``stateloop eval`` measures and how.

The defaults are the paper's evaluation (Tables 1 and 2): held-out token perplexity, lm-eval's own
tasks at zero and five shots. The small scales set ``tasks`` to the offline tasks of
``workflow/tasks/`` (see :mod:`stateloop.evaluate.tasks.prepare`) and ``task_data`` to their folders.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stateloop.config import Bool, ConfigError, Int, Text, section

# Tables 1 and 2, lm-eval's own task names. Which metric each table prints: evaluate/metrics.py.
PAPER_TASKS = ["lambada_openai", "arc_easy", "arc_challenge", "winogrande", "piqa", "hellaswag", "sciq", "race", "wikitext"]


@section(key="eval", frozen=True)
class EvalConfig:
    tasks: list[Text] = Field(default_factory=lambda: list(PAPER_TASKS), description="lm-eval names (built-in or workflow/tasks/)")
    shots: list[Int] = Field(default_factory=lambda: [0, 5], description="few-shot counts; perplexity tasks run at 0 only")
    limit: Int | None = Field(None, gt=0, description="at most this many documents per task (quick runs); None: all")
    batch_size: Int = Field(16, gt=0, description="sequences per forward pass")
    max_length: Int | None = Field(None, gt=0, description="context window in tokens; None: the run's train.seq_len, else "
        "model.max_seq_len")
    precision: Literal["32-true", "bf16-mixed"] = Field("32-true", description="\"32-true\" or \"bf16-mixed\" (bf16 autocast, on the CPU "
        "too)")
    device: Text = Field("auto", description="\"auto\": cuda when available, else cpu")
    task_data: dict[Text, Text] = Field(default_factory=dict, description="local task -> folder of its source files")
    task_dir: Text | None = Field(None, description="local task YAMLs; None: the checkout's workflow/tasks/")
    heldout_split: Text = Field("val", description="split of the run's token shards for the held-out perplexity")
    heldout_windows: Int | None = Field(None, gt=0, description="at most this many windows of max_length tokens; None: the whole split")
    synthetic_examples: Int = Field(500, gt=0, description="held-out examples per synthetic task")
    fewshot_pool: Int = Field(100, gt=0, description="training examples per synthetic task (the few-shot pool)")
    seed: Int = Field(0, description="few-shot sampling and synthetic examples")
    bootstrap_iters: Int = Field(1000, ge=0, description="lm-eval's bootstrap for standard errors of non-mean metrics (0: none)")
    log_samples: Bool = Field(True, description="keep every prompt and answer (eval_samples/ in the run folder)")
    K: Int | None = Field(None, gt=0, description="The loop depth to evaluate at; None: the K the run was trained with. Another K' "
        "evaluates the trained weights at K' iterations (models/looped.py: LoopedLM.at_depth) and writes eval_K{K'}.json instead of "
        "eval.json. Not the paper's protocol (it evaluates \"at the depth used during training\"): this project's test-time depth "
        "study.")

    def __post_init__(self) -> None:
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"eval.tasks: duplicate task names in {self.tasks}")
        if not self.shots or any(s < 0 for s in self.shots) or len(set(self.shots)) != len(self.shots):
            raise ConfigError(f"eval.shots: expected distinct non-negative shot counts, got {self.shots}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda") or self.device == "mps"):
            raise ConfigError(f"eval.device: expected auto, cpu, cuda[:N] or mps; got {self.device!r}")
