"""A compute ladder: StateLoop's paired PPL gap to Vanilla Looped against training compute.

The project's own question, not a claim of the paper. A ladder is a config whose experiments
``ladder_1``, ``ladder_2``, ... (:data:`RUNGS`, smallest first) each train StateLoop and Vanilla
Looped at one scale, at the same loop counts and seeds (configs/ladder.yaml). For each K:

- each rung's gap, seed by seed, of the held-out PPL at the rung's training compute (FLOPs per
  sequence by models/flops.py's count, times the sequences trained on);
- the fitted trend: [choice] ordinary least squares of every (rung, seed) gap against log10 FLOPs
  (the runs are independent across rungs, so every seed of every rung is one observation), the
  slope with its t interval (n - 2 degrees of freedom) and the verdict of report/trends.py
  (shrinks / grows / holds (no trend resolved), against the sign of the largest rung's gap);
- where the trend crosses 0: log10 C* = -intercept / slope with Fieller's 95% interval (the
  compute values whose fitted gap the fit's own interval does not tell from 0). It is bounded only
  when the slope's interval excludes 0; otherwise the row says "no crossing within the fit's
  interval".

[choice] An lr bracket per rung (configs/overlays/ladder_lr.yaml): experiments ``ladder_N_lr_*``
train rung N's models at other peak lrs, nothing else changed. A rung with more than one lr takes,
seed by seed, StateLoop at its own best lr of the rung's points against Vanilla Looped at its own
(report/lr.py's rule: the lowest mean held-out PPL over the seeds every point has for both models),
and the claims note names each rung's best lrs and whether one lies at the edge of the rung's grid
(then the optimum is not bracketed there).

The paper's two points, on the same axes (a % PPL change is scale-free): 1.4B StateLoop against
Vanilla Looped at K = 4 (Table 1) and 410M at K = 7 (Table 4), at the training FLOPs of
configs/paper.yaml's runs by the same count.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import lr
from stateloop.report.stats import Estimate, relative_pct, t_quantile
from stateloop.report.tables import reference
from stateloop.report.trends import trend_verdict
from stateloop.train.flops import flops_per_sequence

RUNGS = tuple(f"ladder_{i}" for i in range(1, 6))
MODEL, REFERENCE = "stateloop", "vanilla_looped"
NO_CROSSING = "no crossing within the fit's interval"
SLOPE_UNIT = "points of % PPL gap per 10x training FLOPs"


@dataclass
class Rung:
    name: str  # the experiment
    flops: float  # StateLoop's training FLOPs at this rung
    gaps: dict[int, float]  # seed -> % PPL gap
    lrs: tuple[float, ...] = ()  # the rung's peak lrs, lowest first
    best_lr: dict[str, float] = field(default_factory=dict)  # model -> its best of ``lrs``

    def best_text(self) -> str:
        """Each model's best lr of the rung's bracket, and whether it lies at the grid's edge; empty
        for a rung trained at one lr."""
        if len(self.lrs) < 2:
            return ""
        grid = ", ".join(f"{x:g}" for x in self.lrs)
        edge = [m for m, x in self.best_lr.items() if x in (self.lrs[0], self.lrs[-1])]
        text = f"best lr of {grid}: StateLoop {self.best_lr[MODEL]:g}, Vanilla Looped {self.best_lr[REFERENCE]:g}"
        return text + (f" ({' and '.join(edge)} at the grid's edge: not bracketed)" if edge else "")


@dataclass
class Fit:
    intercept: float  # at log10 FLOPs = 0
    slope: float  # per decade of FLOPs
    var_a: float
    var_b: float
    cov_ab: float
    dof: int

    def predict(self, x: float) -> float:
        return self.intercept + self.slope * x

    def se(self, x: float) -> float:
        """Standard error of the fitted mean gap at log10 FLOPs x."""
        return math.sqrt(max(self.var_a + 2 * x * self.cov_ab + x * x * self.var_b, 0.0))

    def slope_estimate(self) -> Estimate:
        if self.dof < 1:
            return Estimate(self.slope, math.nan, math.nan, self.dof + 2, "fewer than three points: no interval")
        h = t_quantile(self.dof + 1) * math.sqrt(self.var_b)  # t with dof = n - 2
        return Estimate(self.slope, self.slope - h, self.slope + h, self.dof + 2,
                        f"95% t interval of the OLS slope over {self.dof + 2} (rung, seed) points")


def rungs(cfg) -> list[str]:
    return [r for r in RUNGS if r in cfg.experiments and cfg.experiments[r].trained]


def loop_counts(cfg) -> list[int]:
    return sorted({r.K for name in rungs(cfg) for r in expand_runs(cfg, [name]) if r.model == MODEL})


_FLOPS: dict[tuple[str, int], int] = {}  # (model config, seq_len) -> FLOPs per sequence (meta-device tracing is slow)


def training_flops(cfg, run) -> float:
    """A run's training FLOPs: forward + backward per sequence times the sequences of its steps."""
    t = cfg.scales[run.scale].train
    key = (repr(run.model_config), t.seq_len)
    if key not in _FLOPS:
        _FLOPS[key] = flops_per_sequence(run.model_config, t.seq_len)
    return float(_FLOPS[key]) * t.total_steps * t.global_batch


def bracket_names(cfg, name: str) -> tuple[str, ...]:
    """Rung ``name``'s experiments: its own and every ``{name}_lr_*`` of its lr bracket."""
    return (name, *sorted(e for e in cfg.experiments if e.startswith(f"{name}_lr_")))


def rung_points(cfg, results: Path, K: int) -> list[Rung]:
    """Each rung's StateLoop - Vanilla gaps at loop count K, paired by seed: at the rung's one lr,
    or each model at its own best lr of the rung's bracket."""
    out = []
    for name in rungs(cfg):
        points = lr.bracket(cfg, results, K, bracket_names(cfg, name))
        seeds = sorted(lr.common_seeds(points))  # none without points
        if not seeds:
            continue
        on = lr.on_seeds(points, set(seeds))
        ours, ref = lr.best(on, MODEL), lr.best(on, REFERENCE)
        gaps = {s: relative_pct(ours.ppl[MODEL][s], ref.ppl[REFERENCE][s]) for s in seeds}
        run = next(r for r in expand_runs(cfg, [points[0].experiment]) if r.model == MODEL and r.K == K)
        out.append(Rung(name, training_flops(cfg, run), gaps, tuple(p.lr for p in points),
                        {MODEL: ours.lr, REFERENCE: ref.lr}))
    return out


def fit(points: list[tuple[float, float]]) -> Fit | None:
    """OLS of y against x over (x, y) points (x = log10 FLOPs); None without two distinct x."""
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        return None
    b = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    dof = n - 2
    s2 = math.fsum((y - a - b * x) ** 2 for x, y in zip(xs, ys)) / dof if dof > 0 else math.nan
    var_b = s2 / sxx
    return Fit(a, b, s2 / n + mx * mx * var_b, var_b, -mx * var_b, dof)


def crossing(f: Fit) -> tuple[float, float, float] | None:
    """(log10 C*, its 95% Fieller interval) where the fitted gap is 0, or None when the interval
    is not bounded (the slope's interval contains 0): {x : (a + b x)^2 <= t^2 se(x)^2}."""
    if f.dof < 1 or f.slope == 0:
        return None
    t2 = t_quantile(f.dof + 1) ** 2
    A = f.slope ** 2 - t2 * f.var_b
    B = 2 * (f.intercept * f.slope - t2 * f.cov_ab)
    C = f.intercept ** 2 - t2 * f.var_a
    if A <= 0:
        return None
    disc = B * B - 4 * A * C
    if disc < 0:
        return None
    r = math.sqrt(disc)
    return -f.intercept / f.slope, (-B - r) / (2 * A), (-B + r) / (2 * A)


@dataclass
class Trend:
    K: int
    rungs: list[Rung]
    fit: Fit | None
    cross: tuple[float, float, float] | None

    @property
    def slope(self) -> Estimate:
        if self.fit is None:
            return Estimate(math.nan, math.nan, math.nan, 0, "fewer than two rungs: no fit")
        return self.fit.slope_estimate()

    @property
    def verdict(self) -> str:
        if self.fit is None:
            return "not run"
        largest = self.rungs[-1].gaps
        return trend_verdict(self.slope, math.fsum(largest.values()) / len(largest))

    def crossing_text(self) -> str:
        """Where the fitted gap crosses 0, and whether that lies outside the rungs' compute: a
        crossing below the smallest rung is the fit run backwards (the gap moves away from 0 as
        compute grows), one above the largest is an extrapolation forwards."""
        if self.cross is None:
            return NO_CROSSING
        x, lo, hi = self.cross
        text = f"the fitted gap crosses 0 at 10^{x:.2f} [10^{lo:.2f}, 10^{hi:.2f}] training FLOPs"
        smallest, largest = (math.log10(f(r.flops for r in self.rungs)) for f in (min, max))
        if x < smallest:
            return f"{text}, below the smallest rung (10^{smallest:.2f}): the fit run backwards"
        if x > largest:
            return f"{text}, past the largest rung (10^{largest:.2f}): an extrapolation"
        return text


def trend(cfg, results: Path, K: int) -> Trend:
    pts = rung_points(cfg, results, K)
    f = fit([(math.log10(r.flops), g) for r in pts for g in r.gaps.values()])
    return Trend(K, pts, f, crossing(f) if f is not None else None)


@functools.cache
def paper_points() -> dict[int, tuple[float, float]]:
    """{K: (training FLOPs, % PPL gap)} of the paper's StateLoop against Vanilla Looped: 1.4B at
    K = 4 (Table 1, 30B tokens) and 410M at K = 7 (Table 4, 25B tokens), the FLOPs of
    configs/paper.yaml's runs by the project's count (minutes of meta-device tracing: cached)."""
    paper = load_pipeline(Path(__file__).resolve().parents[3] / "configs" / "paper.yaml")
    t1 = reference("table1_ppl").set_index("model").pile_ppl
    t4 = reference("table4_ablations").drop_duplicates("variant").set_index("variant").pile_ppl
    gaps = {4: ("table1", relative_pct(t1["stateloop"], t1["vanilla_looped"])),
            7: ("table4", relative_pct(t4["stateloop"], t4["vanilla_looped"]))}
    out = {}
    for K, (experiment, gap) in gaps.items():
        run = next(r for r in expand_runs(paper, [experiment]) if r.model == MODEL and r.K == K)
        out[K] = (training_flops(paper, run), float(gap))
    return out
