"""An experiment's own comparison: ``results/compare_NAME.csv`` and ``.md`` (and the figure
``figures/compare_NAME.pdf``, Figure 2's form, where it varies K: figures.comparison).

Every experiment of two models or more that no table or figure of the paper reads gets one
(report/outputs.py: ``comparisons``), named after it: a config's own question, such as a new model
against Vanilla Looped. One row per cell (model, K, d_s): the held-out PPL of each seed, their
mean with its 95% t interval, and, for every model but the baseline (``baseline:``, Vanilla Looped
by default), its PPL change against the baseline's cell at the same K, paired by seed, with its
95% interval and a verdict. These are the statistics of Table 1's claims, by the same functions:
``claims.ppl_gap`` (``stats.paired`` of ``stats.relative_pct`` per seed) and ``stats.verdict``
with the sign of those claims (lower PPL); the verdict is worded for an experiment rather than
the paper: better (lower PPL, the interval excluding 0), worse (higher PPL, the interval excluding
0), inconclusive (the interval contains 0, or one seed: no interval).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from stateloop.experiments import cells, expand_runs
from stateloop.report import stats
from stateloop.report.claims import LOWER_PPL, PCT, experiment_cell, ppl_gap
from stateloop.report.outputs import baseline_of, loop_counts
from stateloop.report.tables import heldout_by_seed, heldout_description

BASELINE = "baseline"  # the verdict of the baseline's own rows
BETTER, WORSE = "better", "worse"
# stats.verdict for an effect the claims expect below 0 (lower PPL), in an experiment's words
VERDICTS = {stats.REPRODUCED: BETTER, stats.CONTRADICTED: WORSE, stats.INCONCLUSIVE: stats.INCONCLUSIVE}


def seed_column(seed: int) -> str:
    return f"ppl_seed{seed}"


def _against(cfg, name: str, baseline: str, run):
    """The baseline's cell a cell of ``run``'s shape is compared with: at the same K (and d_s where
    the baseline has a state), else at the baseline's only K (an experiment's ``K_by_model``); None
    where it has several and none at this K."""
    same = experiment_cell(cfg, name, baseline, run.K, run.d_s)
    if same is not None:
        return same
    Ks = loop_counts(cfg, name, baseline)
    return experiment_cell(cfg, name, baseline, Ks[0], run.d_s) if len(Ks) == 1 else None


def compare(cfg, results: Path, name: str) -> pd.DataFrame:
    """Experiment ``name``'s comparison (``compare_NAME.csv``): one row per cell, in the
    experiment's order of models, K and d_s."""
    if name not in cfg.experiments:
        raise KeyError(f"experiments.{name}: the config defines no such experiment (defined: {', '.join(cfg.experiments)})")
    baseline = baseline_of(cfg, name)
    runs = expand_runs(cfg, [name])
    seeds = sorted({r.seed for r in runs})
    rows = []
    for rs in cells(runs).values():
        run = rs[0]
        ppl = heldout_by_seed(results, rs)
        est = stats.t_interval(list(ppl.values()))
        row = {"experiment": name, "model": run.model, "K": run.K, "d_s": run.d_s, "baseline": baseline,
               **{seed_column(s): ppl.get(s, math.nan) for s in seeds},
               "ppl": est.mean, "ppl_lo": est.lo, "ppl_hi": est.hi, "seeds": len(rs)}
        theirs = None if run.model == baseline else _against(cfg, name, baseline, run)
        if run.model == baseline:
            row.update(effect_pct=math.nan, ci_lo=math.nan, ci_hi=math.nan, ci_half_width=math.nan, n=len(rs),
                       method="", verdict=BASELINE, note="the baseline")
        elif theirs is None:
            row.update(effect_pct=math.nan, ci_lo=math.nan, ci_hi=math.nan, ci_half_width=math.nan, n=0, method="",
                       verdict=stats.INCONCLUSIVE, note=f"{baseline} has no cell at K={run.K} in this experiment")
        else:
            gap, note = ppl_gap(results, rs, theirs)
            row.update(effect_pct=gap.mean, ci_lo=gap.lo, ci_hi=gap.hi, ci_half_width=gap.half_width, n=gap.n,
                       method=gap.method, verdict=VERDICTS[stats.verdict(gap, LOWER_PPL)], note=note)
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame, cfg, name: str, config_name: str) -> str:
    """The comparison as printed: a line on what is compared, the table, how to read it."""
    def num(v, digits: int = 2, sign: bool = False) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{'+' if sign else ''}.{digits}f}"

    exp, baseline = cfg.experiments[name], baseline_of(cfg, name)
    runs = expand_runs(cfg, [name])
    seeds = sorted({r.seed for r in runs})
    counts = df[df.verdict != BASELINE].verdict.value_counts()
    lines = [f"# Comparison: {name}", "",
             f"Config `{config_name}`, experiment `{name}` (scale {exp.scale}): {', '.join(exp.models)}, each against "
             f"**{baseline}** on held-out PPL ({heldout_description(cfg, runs)}), seeds {', '.join(map(str, seeds))}. "
             + ", ".join(f"{counts.get(v, 0)} {v}" for v in (BETTER, WORSE, stats.INCONCLUSIVE)) + ".", "",
             "| model | K | d_s | " + " | ".join(f"PPL seed {s}" for s in seeds)
             + " | PPL [95% CI] | vs baseline [95% CI] | resolves | n | verdict |",
             "|---|---|---|" + "---|" * len(seeds) + "---|---|---|---|---|"]
    for _, r in df.iterrows():
        ppl = num(r.ppl) + (f" [{num(r.ppl_lo)}, {num(r.ppl_hi)}]" if not math.isnan(r.ppl_lo) else "")
        if r.verdict == BASELINE:
            effect = "(baseline)"
        elif math.isnan(r.effect_pct):
            effect = "-"
        else:
            effect = num(r.effect_pct, sign=True) + (f" [{num(r.ci_lo, sign=True)}, {num(r.ci_hi, sign=True)}]"
                                                     if not math.isnan(r.ci_lo) else "") + f" {PCT}"
        resolves = "-" if math.isnan(r.ci_half_width) else f"{r.ci_half_width:.2f}"
        lines.append(f"| {r.model} | {r.K} | {r.d_s} | " + " | ".join(num(r[seed_column(s)]) for s in seeds)
                     + f" | {ppl} | {effect} | {resolves} | {r.n} | **{r.verdict}** |")
    lines += ["",
              f"'vs baseline' is each model's held-out PPL change against {baseline} at the same K, "
              "100 (PPL / PPL_baseline - 1) per seed, then its mean and 95% Student-t interval over the seeds both "
              "trained (paired: the same seed, the same init stream and data order; Welch's unpaired interval where they "
              "share none); 'resolves' is the interval's half width, the smallest change these seeds tell from 0. "
              "Verdicts: better = lower PPL with the interval excluding 0; worse = higher PPL with the interval "
              "excluding 0; inconclusive = the interval contains 0 (or one seed: no interval). The statistics of "
              "Table 1's claims in results/claims.md (stateloop.report.compare).", ""]
    return "\n".join(lines)
