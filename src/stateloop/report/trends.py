"""Trends over training tokens: the paired PPL gap of each comparison at every validation point.

The project's own question, not a claim of the paper: a model that loses at the end of training
may be closing the gap or falling further behind, and only the run's learning curve says which.
Every training run validates on the same held-out windows every ``train.val_every`` steps and
after its last step (train/loop.py, ``val_curve`` and ``val_windows`` in train.json).

For each comparison of two models on PPL (:func:`comparisons`), the gap at a validation point is,
seed by seed, ``100 (PPL_a / PPL_b - 1)`` with PPL = exp(validation loss) (:func:`gap_curves`).

The trend (:func:`slope`): [choice] for each seed, the least-squares slope of its gap against
log10(tokens) (points of % PPL per tenfold more tokens), then the mean and 95% t interval of the
slopes over seeds. A pooled regression over all points would count the points of one seed as
independent, which they are not (one training trajectory, each point a continuation of the
previous); the seed is the unit that repeats. The verdict (:func:`trend_verdict`): "shrinks" when
the slope's interval excludes 0 on the side opposite to the final gap (the mean gap at the last
point: the gap moves toward 0), "grows" when it excludes 0 on the same side, else "holds (no
trend resolved)". Whether the gap moves toward the paper's sign is said beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from stateloop.experiments import Run, cells, expand_runs
from stateloop.report.stats import Estimate, relative_pct, t_interval
from stateloop.report.tables import read_json

SHRINKS, GROWS, HOLDS = "shrinks", "grows", "holds (no trend resolved)"
SLOPE_UNIT = "points of % PPL gap per 10x tokens"

# (experiment, model, reference): the PPL comparisons whose gap is followed over tokens; the
# reference is taken at the same scale, K and (for a stateful reference) d_s.
PAIRS = (
    ("table1", "stateloop", "vanilla_looped"),
    ("table1", "stateloop_attn", "vanilla_looped"),
    ("table1", "stateloop_mamba2", "vanilla_looped"),
    ("table1", "stateloop", "vanilla_looped_ffn"),
    ("table4", "stateloop", "vanilla_looped"),
    ("table4", "state_only", "stateloop"),
    ("table4", "reset_state", "stateloop"),
    ("table4", "stateloop_gru", "stateloop"),
    ("loop_depth", "stateloop", "vanilla_looped"),
)
EXPERIMENTS = tuple(dict.fromkeys(e for e, _, _ in PAIRS))  # whose runs' train.json the figure and rows read
# The paper's sign of each comparison's gap (its claims: StateLoop and its variants lower PPL, the
# ablations raise it against StateLoop).
PAPER_SIGN = {"vanilla_looped": -1, "vanilla_looped_ffn": -1, "stateloop": 1}
GROUPS = ("StateLoop vs Vanilla Looped", "variants vs Vanilla Looped", "ablations vs StateLoop")


@dataclass(frozen=True)
class Comparison:
    ours: list[Run]  # the runs of one cell, every seed the config trains it with
    theirs: list[Run]  # the reference cell's

    @property
    def model(self) -> str:
        return self.ours[0].model

    @property
    def against(self) -> str:
        return self.theirs[0].model

    @property
    def id(self) -> str:
        r = self.ours[0]
        return f"tokens_trend_{r.scale}_{r.model}_vs_{self.against}_K{r.K}_ds{r.d_s}"

    @property
    def label(self) -> str:
        return f"{self.model} vs {self.against}, K={self.ours[0].K}"

    @property
    def group(self) -> str:
        if self.against == "stateloop":
            return GROUPS[2]
        return GROUPS[0] if self.model == "stateloop" and self.against == "vanilla_looped" else GROUPS[1]

    @property
    def paper_sign(self) -> int:
        return PAPER_SIGN[self.against]


def comparisons(cfg) -> list[Comparison]:
    """Every PPL comparison of :data:`PAIRS` the config trains, once per pair of cells (Table 4's
    StateLoop-Vanilla pair at K = 7 is Figure 2's at K = 7), each cell with all its seeds."""
    trained = [n for n in EXPERIMENTS if n in cfg.experiments and cfg.experiments[n].trained]
    if not trained:
        return []
    by_cell = cells(expand_runs(cfg, trained))  # every seed of a cell these experiments train
    out: dict[tuple[str, str], Comparison] = {}
    for experiment, model, against in PAIRS:
        if experiment not in trained:
            continue
        for cell in cells(expand_runs(cfg, [experiment])):
            r = by_cell[cell][0]
            if r.model != model:
                continue
            ref = next((rs for rs in by_cell.values() if rs[0].model == against and rs[0].scale == r.scale
                        and rs[0].K == r.K and (rs[0].d_s == r.d_s or not rs[0].d_s)), None)
            if ref is not None:
                out.setdefault((cell, ref[0].cell), Comparison(by_cell[cell], ref))
    return list(out.values())


def read_curve(results: Path, run: Run) -> tuple[dict[int, float], dict | None]:
    """({tokens: validation loss}, the windows' identity) of a run's train.json."""
    summary = read_json(results / "runs" / run.id / "train.json")
    return {int(p["tokens"]): float(p["loss"]) for p in summary.get("val_curve") or []}, summary.get("val_windows")


def gap_curves(results: Path, comp: Comparison) -> dict[int, dict[int, float]]:
    """{seed: {tokens: % PPL gap}} over the seeds both cells have and the validation points both
    runs of a seed have. Refuses runs whose validations read other windows (train.json's
    ``val_windows``): their points would not be comparable."""
    theirs = {r.seed: r for r in comp.theirs}
    out, windows = {}, {}
    for run in comp.ours:
        if run.seed not in theirs:
            continue
        (a, wa), (b, wb) = read_curve(results, run), read_curve(results, theirs[run.seed])
        for r, w in ((run, wa), (theirs[run.seed], wb)):
            if w is not None:
                windows.setdefault(w["sha256"], r.id)
        if len(windows) > 1:
            first, other = list(windows.values())[:2]
            raise ValueError(f"{results}/runs/{first}/train.json and {results}/runs/{other}/train.json: validation read "
                             f"other held-out windows (val_windows.sha256 differs); their curves cannot be compared")
        shared = sorted(set(a) & set(b))
        if shared:
            out[run.seed] = {t: relative_pct(math.exp(a[t]), math.exp(b[t])) for t in shared}
    return out


def pointwise(curves: dict[int, dict[int, float]]) -> dict[int, Estimate]:
    """{tokens: mean gap and its 95% t interval over the seeds that have that point}."""
    points = sorted({t for c in curves.values() for t in c})
    return {t: t_interval([c[t] for c in curves.values() if t in c], what="paired seeds") for t in points}


def fit_slope(points: dict[int, float]) -> float:
    """The least-squares slope of y against log10(x) over {x: y} (at least two distinct x)."""
    xs = [math.log10(t) for t in points]
    ys = list(points.values())
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def slope(curves: dict[int, dict[int, float]]) -> Estimate | None:
    """Mean and 95% t interval over seeds of each seed's slope (module docstring); None when no
    seed has two validation points."""
    slopes = [fit_slope(c) for c in curves.values() if len(c) >= 2]
    return t_interval(slopes, what="paired seeds") if slopes else None


def trend_verdict(est: Estimate, final_gap: float) -> str:
    """shrinks / grows / holds (no trend resolved): the slope's side of 0 against the final gap's."""
    if not est.excludes_zero():
        return HOLDS
    return SHRINKS if math.copysign(1, est.mean) != math.copysign(1, final_gap) else GROWS


def measure(results: Path, comp: Comparison) -> tuple[Estimate, str, str]:
    """(the slope, its verdict, a note) of one comparison; the verdict is "not run" when no seed
    has two validation points (train.val_every)."""
    curves = gap_curves(results, comp)
    est = slope(curves)
    if est is None:
        return (Estimate(math.nan, math.nan, math.nan, 0, "no curve"), "not run",
                f"{comp.ours[0].cell} vs {comp.theirs[0].cell}: fewer than two validation points per run (train.val_every)")
    final = pointwise(curves)
    last = max(final)
    toward = "toward" if math.copysign(1, est.mean) == comp.paper_sign else "away from"
    npoints = sorted({len(c) for c in curves.values()})
    note = (f"{comp.ours[0].cell} vs {comp.theirs[0].cell}: gap {final[min(final)].format()}% at {min(final):,} tokens, "
            f"{final[last].format()}% at {last:,}; {'/'.join(map(str, npoints))} validation points per seed; "
            f"the slope points {toward} the paper's sign")
    return est, trend_verdict(est, final[last].mean), note
