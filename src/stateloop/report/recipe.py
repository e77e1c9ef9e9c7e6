"""The recipe A/B: does StateLoop's verdict against Vanilla Looped depend on the recipe the
project chose where the paper is silent?

The project's own question, not a claim of the paper. The paper states its shapes, lrs, batch and
schedule but not the backbone's init or the warm-up; the project's recipe draws the
residual-output projections (and the state reads) from N(0, 0.02 / sqrt(2 K L)) and warms up
over its own span, while the authors' public configs (LUMIA-Group/PonderLM-2, docs/choices.md)
draw every weight from N(0, initializer_range) and warm up over 2% of the steps. A config holds
the authors' recipe as experiments ``authors_lr_1``, ``authors_lr_2``, ... (:data:`POINTS`, lowest
lr first; configs/decide.yaml), each at one peak lr of the project's lr bracket (report/lr.py),
same models, loop counts and seeds. For each K:

- the row's effect: StateLoop's held-out PPL change against Vanilla Looped under the authors'
  recipe, each model at its own best lr of the recipe's points, paired by seed (report/lr.py's
  rule), and the claim's verdict;
- the note: each lr's gap under the authors' recipe; the project's recipe at the same lrs and
  seeds, judged the same way; and what the recipe does to each model's own PPL (the authors'
  against the project's, each at its best lr, paired by seed).
"""

from __future__ import annotations

from pathlib import Path

from stateloop.report import lr, stats
from stateloop.report.stats import Estimate, paired, relative_pct

POINTS = tuple(f"authors_lr_{i}" for i in range(1, 6))


def experiments(cfg) -> list[str]:
    return lr.experiments(cfg, POINTS)


def loop_counts(cfg) -> list[int]:
    return lr.loop_counts(cfg, POINTS)


def recipes(cfg, results: Path, K: int) -> tuple[list[lr.Point], list[lr.Point]]:
    """(the authors' points, the project's points) at loop count K: the project's bracket cut to
    the authors' lrs, both on the seeds every point of both has for both models."""
    authors = lr.bracket(cfg, results, K, POINTS)
    lrs = {p.lr for p in authors}
    project = [p for p in lr.bracket(cfg, results, K) if p.lr in lrs]
    seeds = lr.common_seeds(authors + project)
    return lr.on_seeds(authors, seeds), lr.on_seeds(project, seeds)


def recipe_change(authors: list[lr.Point], project: list[lr.Point], model: str) -> Estimate:
    """The model's PPL under the authors' recipe against the project's, each at its best lr."""
    return paired(lr.best(authors, model).ppl[model], lr.best(project, model).ppl[model], relative_pct)


def measure(cfg, results: Path, K: int) -> tuple[Estimate, str, str] | None:
    """(the gap under the authors' recipe at each model's best lr, a note, the verdict)."""
    authors, project = recipes(cfg, results, K)
    if not authors:
        return None
    each = "; ".join(f"lr {p.lr:g}: {p.gap.format()}% ({p.verdict})" for p in authors)
    gap = lr.tuned_gap(authors)
    note = (f"authors' recipe: {each}; best lr StateLoop {lr.best(authors, lr.MODEL).lr:g}, Vanilla Looped "
            f"{lr.best(authors, lr.REFERENCE).lr:g}")
    if project:
        theirs = lr.tuned_gap(project)
        note += (f". The project's recipe at the same lrs and seeds: {theirs.format()}% "
                 f"({stats.verdict(theirs, lr.PAPER_SIGN)}). The authors' recipe against the project's, each "
                 f"model at its best lr: Vanilla Looped {recipe_change(authors, project, lr.REFERENCE).format()}%, "
                 f"StateLoop {recipe_change(authors, project, lr.MODEL).format()}%")
    return gap, note, stats.verdict(gap, lr.PAPER_SIGN)
