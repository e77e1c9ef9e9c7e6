"""``eval:`` section of a scale: what ``stateloop eval`` measures and how.

The defaults are the paper's evaluation (Tables 1 and 2): held-out token perplexity, lm-eval's own
tasks at zero and five shots. The small scales set ``tasks`` to the offline tasks of
``workflow/tasks/`` (see :mod:`stateloop.evaluate.tasks.prepare`) and ``task_data`` to their folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stateloop.config import ConfigError

# Tables 1 and 2, lm-eval's own task names. Which metric each table prints: evaluate/metrics.py.
PAPER_TASKS = ["lambada_openai", "arc_easy", "arc_challenge", "winogrande", "piqa", "hellaswag", "sciq", "race", "wikitext"]

PRECISIONS = ("32-true", "bf16-mixed")


@dataclass(frozen=True)
class EvalConfig:
    tasks: list[str] = field(default_factory=lambda: list(PAPER_TASKS))  # lm-eval names (built-in or workflow/tasks/)
    shots: list[int] = field(default_factory=lambda: [0, 5])  # few-shot counts; perplexity tasks run at 0 only
    limit: int | None = None  # at most this many documents per task (quick runs); None: all
    batch_size: int = 16  # sequences per forward pass
    max_length: int | None = None  # context window in tokens; None: the run's train.seq_len, else model.max_seq_len
    precision: str = "32-true"  # "32-true" or "bf16-mixed" (bf16 autocast, on the CPU too)
    device: str = "auto"  # "auto": cuda when available, else cpu
    task_data: dict[str, str] = field(default_factory=dict)  # local task -> folder of its source files
    task_dir: str | None = None  # local task YAMLs; None: the checkout's workflow/tasks/
    heldout_split: str = "val"  # split of the run's token shards for the held-out perplexity
    heldout_windows: int | None = None  # at most this many windows of max_length tokens; None: the whole split
    synthetic_examples: int = 500  # held-out examples per synthetic task
    fewshot_pool: int = 100  # training examples per synthetic task (the few-shot pool)
    seed: int = 0  # few-shot sampling and synthetic examples
    bootstrap_iters: int = 1000  # lm-eval's bootstrap for standard errors of non-mean metrics (0: none)
    log_samples: bool = True  # keep every prompt and answer (eval_samples/ in the run folder)
    # The loop depth to evaluate at; None: the K the run was trained with. Another K' evaluates the
    # trained weights at K' iterations (models/looped.py: LoopedLM.at_depth) and writes
    # eval_K{K'}.json instead of eval.json. Not the paper's protocol (it evaluates "at the depth
    # used during training"): this project's test-time depth study.
    K: int | None = None

    def __post_init__(self) -> None:
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"eval.tasks: duplicate task names in {self.tasks}")
        if not self.shots or any(s < 0 for s in self.shots) or len(set(self.shots)) != len(self.shots):
            raise ConfigError(f"eval.shots: expected distinct non-negative shot counts, got {self.shots}")
        for key in ("limit", "max_length", "heldout_windows", "K"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ConfigError(f"eval.{key}: must be positive or null, got {value}")
        for key in ("batch_size", "synthetic_examples", "fewshot_pool"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"eval.{key}: must be positive, got {getattr(self, key)}")
        if self.bootstrap_iters < 0:
            raise ConfigError(f"eval.bootstrap_iters: must be >= 0, got {self.bootstrap_iters}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"eval.precision: must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.device != "auto" and not (self.device == "cpu" or self.device.startswith("cuda") or self.device == "mps"):
            raise ConfigError(f"eval.device: expected auto, cpu, cuda[:N] or mps; got {self.device!r}")
