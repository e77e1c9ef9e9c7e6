"""Uncertainty over seeds: means with 95% confidence intervals, paired where runs share seeds.

Every number the tables, figures and claims report for a cell (the runs of one scale, model, K
and d_s over their seeds) is an :class:`Estimate`: the mean over seeds and a two-sided Student-t
interval, ``mean +- t_{0.975, n-1} * sd / sqrt(n)``. One seed gives no interval (NaN bounds).

A comparison of two cells (StateLoop against Vanilla Looped, say) is **paired** when they share
seeds: runs with the same seed see the same data order, so the per-seed differences carry less
noise than the difference of two means; the interval is the t interval of those per-seed
differences (:func:`paired`). Cells without shared seeds fall back to Welch's unpaired interval
on the difference of means (:func:`unpaired`). Relative changes (``100 * (a / b - 1)``) are
formed per seed and then averaged (paired), or from the means (unpaired, the interval scaled by
the reference mean).

A claim's **verdict** (:func:`verdict`): *reproduced* when our effect has the paper's sign and the
interval excludes 0; *contradicted* when it has the opposite sign and the interval excludes 0;
*inconclusive* otherwise (including a single seed, which has no interval).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scipy import stats as _st

LEVEL = 0.95
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"


@dataclass(frozen=True)
class Estimate:
    mean: float
    lo: float  # NaN with one sample
    hi: float
    n: int  # samples (seeds, or seed pairs)
    method: str  # how the interval was formed, in words

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2

    @property
    def bar(self) -> float:
        """An error bar's half length: the interval's half width, 0 with one seed (no interval)."""
        return 0.0 if math.isnan(self.lo) else self.half_width

    def excludes_zero(self) -> bool:
        return not math.isnan(self.lo) and (self.lo > 0 or self.hi < 0)

    def format(self, digits: int = 2) -> str:
        if math.isnan(self.lo):
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} [{self.lo:.{digits}f}, {self.hi:.{digits}f}]"


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student-t quantile for ``n`` samples (n - 1 degrees of freedom)."""
    return float(_st.t.ppf(0.5 + level / 2, n - 1))


def t_interval(values: Sequence[float], level: float = LEVEL, what: str = "seeds") -> Estimate:
    """Mean and t interval of ``values`` (one per seed)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("no values to summarise")
    n, mean = len(xs), math.fsum(xs) / len(xs)
    if n == 1:
        return Estimate(mean, math.nan, math.nan, 1, f"one {what[:-1]}: no interval")
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    h = t_quantile(n, level) * sd / math.sqrt(n)
    return Estimate(mean, mean - h, mean + h, n, f"{int(level * 100)}% t interval over {n} {what}")


def difference(a: float, b: float) -> float:
    return a - b


def relative_pct(a: float, b: float) -> float:
    """``100 * (a / b - 1)``: a's change relative to b, in percent."""
    return 100.0 * (a / b - 1.0)


def paired(a: Mapping[int, float], b: Mapping[int, float], effect: Callable[[float, float], float] = difference,
           level: float = LEVEL) -> Estimate:
    """``effect(a, b)`` per seed over the seeds both have, with its t interval; Welch's unpaired
    interval (:func:`unpaired`) when they share none."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return unpaired(list(a.values()), list(b.values()), effect, level)
    return t_interval([effect(a[s], b[s]) for s in shared], level, what="paired seeds")


def unpaired(a: Sequence[float], b: Sequence[float], effect: Callable[[float, float], float] = difference,
             level: float = LEVEL) -> Estimate:
    """Welch's interval for mean(a) - mean(b); for a relative effect the interval of the
    difference divided by mean(b) (the reference's own noise is then ignored: say so)."""
    if not a or not b:
        raise ValueError("no values to compare")
    ma, mb = math.fsum(a) / len(a), math.fsum(b) / len(b)
    est = effect(ma, mb)
    if len(a) < 2 or len(b) < 2:
        return Estimate(est, math.nan, math.nan, min(len(a), len(b)), "fewer than two seeds on a side: no interval")
    va = math.fsum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = math.fsum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Estimate(est, est, est, min(len(a), len(b)), "Welch interval (no spread)")
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    h = float(_st.t.ppf(0.5 + level / 2, dof)) * se
    if effect is not difference:  # relative: scale the interval of the difference
        h = abs(effect(mb + h, mb))
    return Estimate(est, est - h, est + h, min(len(a), len(b)), f"{int(level * 100)}% Welch interval (unpaired)")


def verdict(est: Estimate, paper_sign: int) -> str:
    """reproduced / contradicted / inconclusive for an effect the paper reports with sign
    ``paper_sign`` (+1 or -1)."""
    if paper_sign not in (1, -1):
        raise ValueError(f"paper_sign must be +1 or -1, got {paper_sign}")
    if not est.excludes_zero():
        return INCONCLUSIVE
    return REPRODUCED if math.copysign(1, est.mean) == paper_sign else CONTRADICTED
