"""A learning-rate bracket: does StateLoop's verdict against Vanilla Looped depend on the peak lr?

The project's own question, not a claim of the paper. The paper trains every model of a scale at
one peak lr; at a small scale the comparison may depend on it. A bracket is a config whose
experiments ``lr_1``, ``lr_2``, ... (:data:`POINTS`, lowest lr first) each train StateLoop and
Vanilla Looped at one scale that differs from the others only in ``train.lr`` (and ``min_lr``),
at the same loop counts and seeds (configs/decide.yaml). The same grid for both models: nothing is
tuned for one of them. For each K:

- at every lr, the paired PPL change and the paper claim's verdict; each model's best lr (the
  lowest mean held-out PPL over its seeds);
- [choice] the row's effect is the gap with each model at its own best lr, paired by seed (the
  seeds share the data order at every lr), so that neither model is judged at an lr that suits
  only the other. The best lr is picked on the same held-out windows the gap is measured on; with
  three grid points this favours neither model, since both are picked the same way;
- the row's verdict: "holds at every lr tried (V)" when the verdict V is the same at every lr, or
  "changes with lr: V1 at lr1; V2 at lr2, ..." otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stateloop.experiments import cells, expand_runs
from stateloop.report import stats, style
from stateloop.report.stats import Estimate, paired, relative_pct, t_interval
from stateloop.report.tables import heldout_by_seed

POINTS = tuple(f"lr_{i}" for i in range(1, 6))
MODEL, REFERENCE = "stateloop", "vanilla_looped"
PAPER_SIGN = -1  # the paper: StateLoop's PPL is below Vanilla Looped's (Tables 1 and 4)
HOLDS = "holds at every lr tried"
CHANGES = "changes with lr"


@dataclass
class Point:
    experiment: str
    lr: float
    ppl: dict[str, dict[int, float]]  # model -> seed -> held-out PPL

    @property
    def gap(self) -> Estimate:
        return paired(self.ppl[MODEL], self.ppl[REFERENCE], relative_pct)

    @property
    def verdict(self) -> str:
        return stats.verdict(self.gap, PAPER_SIGN)


def experiments(cfg, names: tuple[str, ...] = POINTS) -> list[str]:
    return [e for e in names if e in cfg.experiments and cfg.experiments[e].trained]


def lr_of(cfg, experiment: str) -> float:
    return cfg.scales[cfg.experiments[experiment].scale].train.lr


def loop_counts(cfg, names: tuple[str, ...] = POINTS) -> list[int]:
    return sorted({r.K for e in experiments(cfg, names) for r in expand_runs(cfg, [e]) if r.model == MODEL})


def bracket(cfg, results: Path, K: int, names: tuple[str, ...] = POINTS) -> list[Point]:
    """The points of the bracket at loop count K, lowest lr first; an lr whose experiment lacks
    one of the two models at K is left out. ``names``: the experiments that make the bracket
    (another recipe's, report/recipe.py)."""
    out = []
    for e in experiments(cfg, names):
        groups = [rs for rs in cells(expand_runs(cfg, [e])).values() if rs[0].K == K]
        ppl = {rs[0].model: heldout_by_seed(results, rs) for rs in groups if rs[0].model in (MODEL, REFERENCE)}
        if len(ppl) == 2:
            out.append(Point(e, lr_of(cfg, e), ppl))
    lrs = [p.lr for p in out]
    if len(set(lrs)) != len(lrs):
        raise ValueError(f"experiments {', '.join(p.experiment for p in out)}: two points of the lr bracket share "
                         f"a peak lr ({lrs}); each lr_N experiment's scale must set its own train.lr")
    return sorted(out, key=lambda p: p.lr)


def common_seeds(points: list[Point]) -> set[int]:
    """The seeds every point has for both models."""
    return set.intersection(*(set(p.ppl[m]) for p in points for m in (MODEL, REFERENCE))) if points else set()


def on_seeds(points: list[Point], seeds: set[int]) -> list[Point]:
    """The points cut to ``seeds``, so that a best lr is picked on the same seeds at every lr."""
    return [Point(p.experiment, p.lr, {m: {s: v for s, v in by_seed.items() if s in seeds}
                                       for m, by_seed in p.ppl.items()}) for p in points]


def best(points: list[Point], model: str) -> Point:
    """The point where ``model``'s mean held-out PPL over its seeds is lowest."""
    return min(points, key=lambda p: math.fsum(p.ppl[model].values()) / len(p.ppl[model]))


def tuned_gap(points: list[Point]) -> Estimate:
    """StateLoop at its best lr against Vanilla Looped at its best lr, paired by seed."""
    return paired(best(points, MODEL).ppl[MODEL], best(points, REFERENCE).ppl[REFERENCE], relative_pct)


def verdict(points: list[Point]) -> str:
    """The row's verdict: the same claim verdict at every lr, or each lr's where they differ."""
    seen = [p.verdict for p in points]
    if len(set(seen)) == 1:
        return f"{HOLDS} ({seen[0]})"
    by_verdict: dict[str, list[str]] = {}
    for p in points:
        by_verdict.setdefault(p.verdict, []).append(f"{p.lr:g}")
    return f"{CHANGES}: " + "; ".join(f"{v} at lr {', '.join(lrs)}" for v, lrs in by_verdict.items())


def measure(cfg, results: Path, K: int) -> tuple[Estimate, str, str] | None:
    """(the gap at each model's best lr, a note with every lr's gap and verdict, the verdict)."""
    points = bracket(cfg, results, K)
    if not points:
        return None
    each = "; ".join(f"lr {p.lr:g}: {p.gap.format()}% ({p.verdict})" for p in points)
    note = (f"{each}. Best lr: StateLoop {best(points, MODEL).lr:g}, Vanilla Looped {best(points, REFERENCE).lr:g} "
            f"(lowest mean held-out PPL); ours = StateLoop at its best lr against Vanilla Looped at its own")
    return tuned_gap(points), note, verdict(points)


def figure(cfg, results: Path):
    """The project's own figure (not the paper's): per K, each model's held-out PPL against the
    peak lr (top) and StateLoop's paired gap with its 95% interval (bottom), log lr axis."""
    Ks = loop_counts(cfg)
    if not Ks:
        raise KeyError(f"experiments: no lr bracket point ({', '.join(POINTS)}) trains {MODEL}")
    fig, axes = style.subplots(2, len(Ks), width=style.FULL if len(Ks) > 1 else style.COLUMN, height=4.2,
                               sharex=True, squeeze=False)
    n_seeds = set()
    for col, K in enumerate(Ks):
        points = bracket(cfg, results, K)
        lrs = [p.lr for p in points]
        top, bottom = axes[0][col], axes[1][col]
        for model, fmt in ((REFERENCE, "o-"), (MODEL, "s-")):
            ests = [t_interval(list(p.ppl[model].values())) for p in points]
            n_seeds.update(len(p.ppl[model]) for p in points)
            top.errorbar(lrs, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=fmt, ms=4,
                         color=style.model_colour(model), label=model)
        gaps = [p.gap for p in points]
        bottom.errorbar(lrs, [g.mean for g in gaps], yerr=[g.bar for g in gaps], fmt="D-", ms=4,
                        color=style.model_colour(MODEL))
        bottom.axhline(0, color=style.GREY, lw=0.6)
        top.set(title=f"K = {K}", xscale="log")
        bottom.set(xlabel="peak learning rate", xscale="log")
        for ax in (top, bottom):
            ax.grid(alpha=0.3, lw=0.5)
            ax.set_xticks(lrs, [f"{x:g}" for x in lrs])
            ax.minorticks_off()
    axes[0][0].set_ylabel("held-out PPL")
    axes[1][0].set_ylabel("PPL(StateLoop) / PPL(Vanilla) - 1 (%)")
    axes[0][-1].legend()
    fig.suptitle(f"Learning-rate bracket (this project's study; {style.seeds_text(n_seeds)})")
    return fig
