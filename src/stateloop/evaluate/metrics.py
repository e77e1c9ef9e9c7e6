"""Which lm-eval metric each table reports: the one place this is decided.

The paper names its tasks but not, for each, whether its Table 2 prints ``acc`` or the
length-normalised ``acc_norm``. [choice] We follow the convention of the Mamba paper (and
lm-eval's usual reporting): ``acc_norm`` for ARC-Challenge and HellaSwag, ``acc`` elsewhere.
Table 1's perplexities are lm-eval's ``perplexity`` for LAMBADA-OpenAI and ``word_perplexity`` for
WikiText-2. LAMBADA's is per *example*: exp of minus the mean, over the examples, of the
log-likelihood of each example's whole target word (all its tokens summed), so it is a
per-target-word perplexity, not a per-token one (the paper calls the column "token PPL").
WikiText-2's is per whitespace-separated word: exp of the total NLL of all documents (rolling
windows) divided by their total word count (lm-eval's ``weighted_perplexity``).
The rendered tables print :func:`describe` under themselves.

Local tasks (``workflow/tasks/``) report under the column of the paper task whose data and prompt
they reproduce (:data:`PAPER_TASK`).
"""

from __future__ import annotations

# Table 2 (accuracy, in percent in the rendered table): task -> lm-eval metric.
ACCURACY_METRIC: dict[str, str] = {
    "lambada_openai": "acc",
    "arc_easy": "acc",
    "arc_challenge": "acc_norm",
    "winogrande": "acc",
    "piqa": "acc",
    "hellaswag": "acc_norm",
    "sciq": "acc",
    "race": "acc",
    # offline tasks of the small scales
    "synth_mc": "acc",
    "synth_cloze": "acc",
}

# Chance level (a fraction) of the multiple-choice tasks when lm-eval did not log the evaluated
# examples (with log_samples the harness measures it: the mean of 1 / choices over the examples).
# RACE, ARC, HellaSwag and SciQ have four options; WinoGrande and PIQA two. Open-ended tasks
# (LAMBADA, synth_cloze) have none.
CHANCE: dict[str, float] = {"arc_easy": 0.25, "arc_challenge": 0.25, "hellaswag": 0.25, "sciq": 0.25, "race": 0.25,
                            "winogrande": 0.5, "piqa": 0.5}

# Table 1 (perplexity, zero-shot): task -> lm-eval metric. The held-out token perplexity of the
# run's own data (the paper's "Pile" column) is computed outside lm-eval (evaluate/perplexity.py).
PERPLEXITY_METRIC: dict[str, str] = {
    "lambada_openai": "perplexity",
    "wikitext": "word_perplexity",
    "synth_cloze": "perplexity",
}

# Local task -> the paper column it stands in for (same data, same prompt).
PAPER_TASK: dict[str, str] = {
    "lambada_openai_local": "lambada_openai",
    "piqa_local": "piqa",
    "wikitext_local": "wikitext",
}


def column(task: str) -> str:
    """The table column a task's numbers go in."""
    return PAPER_TASK.get(task, task)


def reported(task: str) -> dict[str, str]:
    """{"accuracy": metric, "perplexity": metric} for the tables this task appears in."""
    col = column(task)
    return {kind: table[col] for kind, table in (("accuracy", ACCURACY_METRIC), ("perplexity", PERPLEXITY_METRIC))
            if col in table}


def describe(table: str = "accuracy", tasks: list[str] | None = None) -> str:
    """One line for under a rendered table, e.g. 'Accuracy: acc_norm for arc_challenge,
    hellaswag; acc for the others.'"""
    metrics = ACCURACY_METRIC if table == "accuracy" else PERPLEXITY_METRIC
    names = [t for t in (tasks or list(metrics)) if t in metrics]
    by_metric: dict[str, list[str]] = {}
    for t in names:
        by_metric.setdefault(metrics[t], []).append(t)
    parts = [f"{m} for {', '.join(ts)}" for m, ts in by_metric.items()]
    line = f"{'Accuracy' if table == 'accuracy' else 'Perplexity'} (lm-eval metric): " + "; ".join(parts) + "."
    if table != "accuracy":
        line += (" lm-eval's `perplexity` is per example (exp of minus the mean log-likelihood of each"
                 " example's whole target word), so LAMBADA's column is a per-target-word perplexity;"
                 " `word_perplexity` is per whitespace-separated word of the documents.")
    return line
