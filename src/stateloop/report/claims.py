"""The paper's claims, judged: one row per claim with the paper's effect, ours with its 95%
confidence interval over seeds, and a verdict (``stateloop.report.stats.verdict``).

Every effect is a difference that is 0 when the claim's two sides are equal, signed so that the
paper's claim says which side of 0 it lies on (``paper_sign``). Comparisons between models are
paired by seed (runs with the same seed read the data in the same order); Table 3's latencies
are paired run by run (the models were timed side by side). A claim whose experiment the config
does not define is listed as "not run", never silently dropped.

Verdicts: *reproduced* (our effect has the paper's sign and its interval excludes 0),
*contradicted* (the opposite sign, interval excluding 0), *inconclusive* (the interval contains
0, or a single seed gives no interval). ``ci_half_width`` is the size of effect the seeds can
resolve: an effect smaller than it could not have been told from 0.

Rows whose source starts with "own" are the project's own questions, not the paper's claims:
whether each PPL gap shrinks, holds or grows with training tokens (report/trends.py) and with
training compute along a ladder, with the compute where its trend crosses 0 (report/ladder.py),
their verdict the trend's: shrinks / grows / holds (no trend resolved); whether StateLoop's verdict
against Vanilla Looped holds at every peak lr of a bracket (report/lr.py); and test-time depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from stateloop.experiments import cells, expand_runs
from stateloop.models.registry import count_params
from stateloop.report import depth, ladder, lr, precision, recipe, stats, trends
from stateloop.report.outputs import BENCH_FILE
from stateloop.report.stats import paired, relative_pct
from stateloop.report.tables import fact, heldout_by_seed, read_json, reference

NOT_RUN = "not run"


@dataclass
class Claim:
    id: str
    claim: str  # one line, as the paper states it
    source: str  # where in the paper
    unit: str  # of our effect
    paper_sign: int  # the side of 0 the paper's effect lies on
    paper_effect: float  # in ``paper_unit`` (NaN where the paper prints no number)
    paper_unit: str
    # (cfg, results) -> (Estimate, note), or (Estimate, note, verdict) for a row judged otherwise
    # than by the paper's sign (the trends), or None when its experiment is absent
    measure: Callable
    experiments: list[str] = field(default_factory=list)


def experiment_cell(cfg, experiment: str, model: str, K: int | None = None, d_s: str | int | None = None):
    """The runs of one model's cell in an experiment: at loop count K (default: the experiment's
    first for that model) and state width d_s (an int, "min" or "max"; default: the first)."""
    if experiment not in cfg.experiments:
        return None
    groups = [rs for rs in cells(expand_runs(cfg, [experiment])).values() if rs[0].model == model]
    if K is not None:
        groups = [rs for rs in groups if rs[0].K == K]
    if not groups:
        return None
    if d_s == "min":
        return min(groups, key=lambda rs: rs[0].d_s)
    if d_s == "max":
        return max(groups, key=lambda rs: rs[0].d_s)
    if d_s is not None:
        groups = [rs for rs in groups if rs[0].d_s == d_s] or groups
    return groups[0]


def _find(cfg, keep):
    """The first cell of the config whose first run ``keep`` accepts, else None."""
    return next((rs for rs in cells(expand_runs(cfg)).values() if keep(rs[0])), None)


def ppl_gap(results, ours, theirs):
    """Our held-out PPL change of cell ``ours`` against ``theirs`` (percent, paired by seed), with
    its note; None where either is missing."""
    if ours is None or theirs is None:
        return None
    return paired(heldout_by_seed(results, ours), heldout_by_seed(results, theirs), relative_pct), \
        f"{ours[0].cell} vs {theirs[0].cell}"


def _ppl_change(experiment: str, model: str, against: str, same_K: bool = True):
    """Our held-out PPL change of ``model`` against ``against`` (percent, paired by seed)."""

    def measure(cfg, results):
        ours = experiment_cell(cfg, experiment, model)
        return None if ours is None else ppl_gap(results, ours, experiment_cell(cfg, experiment, against, ours[0].K if same_K else None))

    return measure


def _ffn_measure(cfg, results):
    out = _ppl_change("table1", "stateloop", "vanilla_looped_ffn", same_K=False)(cfg, results)
    if out is None:
        return None
    est, note = out
    sl, ffn = experiment_cell(cfg, "table1", "stateloop"), experiment_cell(cfg, "table1", "vanilla_looped_ffn")
    ps, pf = count_params(sl[0].model_config), count_params(ffn[0].model_config)
    premise = "holds" if ps < pf else "FAILS"
    return est, f"{note}; fewer parameters {premise}: {ps / 1e6:.3f}M vs {pf / 1e6:.3f}M"


def _advantage_growth(cfg, results):
    """adv(K) = 100 (1 - PPL_StateLoop / PPL_Vanilla) per seed; effect adv(K_max) - adv(K_min)."""
    if "loop_depth" not in cfg.experiments:
        return None
    Ks = sorted({r.K for r in expand_runs(cfg, ["loop_depth"])})
    lo, hi = Ks[0], Ks[-1]
    adv = {}
    for K in (lo, hi):
        s, v = experiment_cell(cfg, "loop_depth", "stateloop", K), experiment_cell(cfg, "loop_depth", "vanilla_looped", K)
        if s is None or v is None:
            return None
        ps, pv = heldout_by_seed(results, s), heldout_by_seed(results, v)
        adv[K] = {seed: -relative_pct(ps[seed], pv[seed]) for seed in set(ps) & set(pv)}
    if lo == hi or not adv[lo] or not adv[hi]:
        return None
    est = paired(adv[hi], adv[lo])
    return est, f"advantage {_mean(adv[lo]):.2f}% at K={lo}, {_mean(adv[hi]):.2f}% at K={hi}"


def _mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


def _narrowest_state(cfg, results):
    s = experiment_cell(cfg, "state_width", "stateloop", d_s="min")
    return None if s is None else ppl_gap(results, s, _find(
        cfg, lambda r: r.model == "vanilla_looped" and r.K == s[0].K and r.scale == s[0].scale))


def _feedback_share(cfg, results):
    s = experiment_cell(cfg, "state_analysis", "stateloop")
    if s is None:
        return None
    shares = [read_json(results / "runs" / r.id / "shapley.json")["feedback_share_pct"] - 50.0 for r in s]
    est = stats.t_interval(shares)
    return est, f"feedback share {est.mean + 50:.1f}% of the total ({s[0].cell})"


def _freeze_vs_replace(cfg, results):
    """Frozen / replaced PPL at the paper's boundary (i = 3 of K = 7; the middle boundary otherwise)."""
    s = experiment_cell(cfg, "state_analysis", "stateloop")
    if s is None:
        return None
    K = s[0].K
    i = 3 if K == 7 else max(1, K // 2)
    effects = {}
    for run in s:
        iv = read_json(results / "runs" / run.id / "interventions.json")
        rep = {e["i"]: e["ppl"] for e in iv["replacement"]}
        frz = {e["i"]: e["ppl"] for e in iv["freezing"]}
        if i not in rep or i not in frz:
            return None
        effects[run.seed] = relative_pct(frz[i], rep[i])
    return stats.t_interval(list(effects.values())), f"boundary i={i} of K={K} ({s[0].cell})"


def _state_branch_latency(cfg, results):
    """latency change of Vanilla K+1 minus that of StateLoop K, both against Vanilla K, per run.
    In lockstep (the DAG's protocol) each run's *median* step latency is used: a run's mean is
    swayed by a few slow steps (a CPU burst), which all models' medians are not."""
    if "decoding" not in cfg.experiments:
        return None
    bench = read_json(results / BENCH_FILE)
    rows = {(r["model"], r["K"]): r for r in bench["rows"]}
    sl = next((r for (m, _), r in rows.items() if m == "stateloop"), None)
    if sl is None:
        return None
    K = sl["K"]
    base, fifth = rows.get(("vanilla_looped", K)), rows.get(("vanilla_looped", K + 1))
    if base is None or fifth is None:
        return None
    def per_run(row):
        return row.get("step_ms_median_runs") or row["latency_ms_per_token"]["runs"]

    b = per_run(base)
    extra_iter = dict(enumerate(relative_pct(x, y) for x, y in zip(per_run(fifth), b)))
    state = dict(enumerate(relative_pct(x, y) for x, y in zip(per_run(sl), b)))
    what = "median step" if base.get("step_ms_median_runs") else "mean latency"
    est = paired(extra_iter, state)
    def floor(row):  # the FLOP share of the change (benchmarks written before it was recorded have none)
        return f" (FLOP floor {row['flops_change_pct']:+.1f}%)" if "flops_change_pct" in row else ""

    return est, (f"vanilla K={K + 1}: {_mean(extra_iter):+.1f}%{floor(fifth)}, stateloop K={K}: {_mean(state):+.1f}%"
                 f"{floor(sl)} (against vanilla K={K}; each run's {what}, {len(b)} runs, {bench['settings']['device']})")


def _paper_t1(model: str, against: str = "vanilla_looped") -> float:
    t1 = reference("table1_ppl").set_index("model").pile_ppl
    return relative_pct(t1[model], t1[against])


def _t4(variant: str) -> float:
    return float(reference("table4_ablations").drop_duplicates("variant").set_index("variant").pile_ppl[variant])


def _paper_t4(variant: str) -> float:
    return relative_pct(_t4(variant), _t4("stateloop"))


def _paper_latency() -> float:
    t3 = reference("table3_decoding").set_index(["model", "K"]).latency_change_pct
    return float(t3[("vanilla_looped", 5)] - t3[("stateloop", 4)])


PCT = "% PPL change"
LOWER_PPL = -1  # the paper_sign of a claim that a model lowers PPL (Table 1's; an experiment's own comparison: compare.py)


def paper_claims() -> list[Claim]:
    """The claims of the paper this pipeline judges, in the paper's order."""
    return [
        Claim("stateloop_vs_vanilla", "StateLoop lowers perplexity against Vanilla Looped", "Table 1", PCT, LOWER_PPL,
              _paper_t1("stateloop"), PCT, _ppl_change("table1", "stateloop", "vanilla_looped"), ["table1"]),
        Claim("stateloop_attn_vs_vanilla", "StateLoop with an attention mixer lowers perplexity against Vanilla Looped",
              "Table 1", PCT, LOWER_PPL, _paper_t1("stateloop_attn"), PCT,
              _ppl_change("table1", "stateloop_attn", "vanilla_looped"), ["table1"]),
        Claim("stateloop_mamba2_vs_vanilla", "StateLoop with a Mamba-2 mixer lowers perplexity against Vanilla Looped",
              "Table 1", PCT, LOWER_PPL, _paper_t1("stateloop_mamba2"), PCT,
              _ppl_change("table1", "stateloop_mamba2", "vanilla_looped"), ["table1"]),
        Claim("stateloop_vs_vanilla_ffn", "StateLoop beats Vanilla Looped + FFN with fewer parameters", "Table 1", PCT, LOWER_PPL,
              _paper_t1("stateloop", "vanilla_looped_ffn"), PCT, _ffn_measure, ["table1"]),
        Claim("advantage_grows_with_K", "StateLoop's advantage over Vanilla Looped grows from K = 3 to K = 7",
              "Figure 2", "points of % PPL advantage", 1,
              fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K7") - fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K3"),
              "PPL (0.14 at K=3 to 0.30 at K=7)", _advantage_growth, ["loop_depth"]),
        Claim("narrowest_state_beats_vanilla", "The narrowest state (d_s = d/8) still beats Vanilla Looped", "Figure 3",
              PCT, -1, math.nan, "below Vanilla (not printed)", _narrowest_state, ["state_width"]),
        Claim("stateloop_vs_vanilla_K7", "StateLoop lowers perplexity against Vanilla Looped at K = 7", "Table 4", PCT, -1,
              relative_pct(_t4("stateloop"), _t4("vanilla_looped")), PCT,
              _ppl_change("table4", "stateloop", "vanilla_looped"), ["table4"]),
        Claim("state_only_worse", "State-only feedback (eq. 13) is worse than StateLoop", "Table 4", PCT, 1,
              _paper_t4("state_only"), PCT, _ppl_change("table4", "state_only", "stateloop"), ["table4"]),
        Claim("reset_state_worse", "Resetting the state every iteration is worse than StateLoop", "Table 4", PCT, 1,
              _paper_t4("reset_state"), PCT, _ppl_change("table4", "reset_state", "stateloop"), ["table4"]),
        Claim("gru_worse", "A GRU update is worse than StateLoop's selective update", "Table 4", PCT, 1,
              _paper_t4("stateloop_gru"), PCT, _ppl_change("table4", "stateloop_gru", "stateloop"), ["table4"]),
        Claim("feedback_reads_dominate", "The feedback reads R_1..R_{K-1} carry most of the Shapley value",
              "Figure 4a", "points of share above 50%", 1, fact("fig4a_shapley", "feedback_reads_share_pct") - 50.0,
              "points above 50% (63.7% feedback)", _feedback_share, ["state_analysis"]),
        Claim("freezing_hurts_more", "Freezing the state hurts far more than a calibrated replacement", "Figure 4b",
              "% PPL, frozen vs replaced", 1,
              relative_pct(fact("fig4b_interventions", "freeze_at_S3_ppl"),
                           fact("fig4b_interventions", "replace_S4_with_calibrated_S3_ppl")),
              "% PPL (18.41 vs 9.08 at i=3)", _freeze_vs_replace, ["state_analysis"]),
        Claim("state_branch_cheaper_than_iteration", "The state branch costs far less decode latency than a fifth iteration",
              "Table 3", "points of latency change", 1, _paper_latency(), "points (25.0% vs 1.4%)",
              _state_branch_latency, ["decoding"]),
    ]


def choice_rows() -> list[Claim]:
    """Open choices measured both ways (not the paper's claims): the read projections' init."""
    rows = []
    for K in (3, 4, 5, 6, 7):
        def vs_vanilla(cfg, results, K=K):
            s = experiment_cell(cfg, "read_init", "stateloop", K)
            return None if s is None else ppl_gap(results, s, _find(cfg, lambda r: r.model == "vanilla_looped" and r.K == K))

        def vs_default(cfg, results, K=K):
            s = experiment_cell(cfg, "read_init", "stateloop", K)
            return None if s is None else ppl_gap(results, s, _find(cfg, lambda r: r.model == "stateloop" and r.K == K
                                                               and r.scale != s[0].scale and r.d_s == s[0].d_s))

        rows.append(Claim(f"read_init_input_vs_vanilla_K{K}", f"With input-style read init, StateLoop lowers perplexity "
                          f"against Vanilla Looped (K = {K})", "choice: model.read_init", PCT, -1, _paper_t1("stateloop"),
                          PCT, vs_vanilla, ["read_init"]))
        rows.append(Claim(f"read_init_input_vs_residual_K{K}", f"Input-style read init against the residual-style "
                          f"default (K = {K})", "choice: model.read_init", PCT, 0, math.nan, "-", vs_default, ["read_init"]))
    return rows


OWN_PREFIX = "own"  # how the source of the project's own rows starts
TOKENS_SOURCE = f"{OWN_PREFIX}: training tokens (not the paper's)"
LADDER_SOURCE = f"{OWN_PREFIX}: compute ladder (not the paper's)"


def token_trend_rows(cfg) -> list[Claim]:
    """The project's own rows (not the paper's claims): the slope of each PPL comparison's paired
    gap against log10 training tokens, with its interval and verdict (report/trends.py)."""
    rows = []
    for comp in trends.comparisons(cfg):
        def measure(cfg, results, comp=comp):
            est, verdict, note = trends.measure(results, comp)
            return est, note, verdict

        rows.append(Claim(comp.id, f"The PPL gap of {comp.label} shrinks with training tokens",
                          TOKENS_SOURCE, trends.SLOPE_UNIT, 0, math.nan,
                          "- (not the paper's)", measure, []))
    return rows


def ladder_rows(cfg) -> list[Claim]:
    """The project's own rows (not the paper's claims): does StateLoop's gap to Vanilla Looped
    shrink as training compute grows along a ladder, and where does the fitted trend cross 0
    (report/ladder.py)? One row per K."""
    rows = []
    for K in ladder.loop_counts(cfg):
        def measure(cfg, results, K=K):
            tr = ladder.trend(cfg, results, K)
            gaps = "; ".join(f"{r.name} {r.flops:.2e} FLOPs: {stats.t_interval(list(r.gaps.values())).format()}%"
                             + (f" ({r.best_text()})" if r.best_text() else "") for r in tr.rungs)
            return tr.slope, f"{tr.crossing_text()}; gaps {gaps}", tr.verdict

        rows.append(Claim(f"ladder_gap_vs_compute_K{K}", f"StateLoop's PPL gap to Vanilla Looped shrinks as training "
                          f"compute grows (K = {K})", LADDER_SOURCE, ladder.SLOPE_UNIT, 0,
                          math.nan, "- (not the paper's)", measure, list(ladder.rungs(cfg))))
    return rows


LR_SOURCE = f"{OWN_PREFIX}: learning rate (not the paper's)"
RECIPE_SOURCE = f"{OWN_PREFIX}: the authors' recipe (not the paper's)"
PRECISION_SOURCE = f"{OWN_PREFIX}: the paper runs' precision (not the paper's)"


def verdict_rows(cfg) -> list[Claim]:
    """The project's own rows (not the paper's claims), one per K of each study, whose effect is
    StateLoop's PPL change against Vanilla Looped: at every peak lr of a bracket (report/lr.py; the
    gap with each model at its own best lr); under the authors' recipe where the paper is silent
    (plain init, their warm-up; report/recipe.py; the note holds the project's recipe at the same lrs
    and seeds); when both models train in the paper runs' precision, bf16-mixed, rather than float32
    (report/precision.py; the note holds the float32 gap on the same seeds and the change)."""
    studies = [(lr, "lr_verdict", "at every peak lr tried", LR_SOURCE, "- (the paper trains at one lr per scale)",
                list(lr.experiments(cfg))),
               (recipe, "recipe_authors_verdict", "under the authors' recipe", RECIPE_SOURCE,
                "- (the paper states neither init nor warm-up)", list(recipe.experiments(cfg))),
               (precision, "precision_bf16_verdict", "when both train in bf16-mixed", PRECISION_SOURCE,
                "- (the paper names no training precision)", [precision.EXPERIMENT])]
    return [Claim(f"{prefix}_K{K}", f"StateLoop lowers perplexity against Vanilla Looped {when} (K = {K})", source, PCT,
                  -1, math.nan, paper_unit, lambda cfg, results, study=study, K=K: study.measure(cfg, results, K), experiments)
            for study, prefix, when, source, paper_unit, experiments in studies for K in study.loop_counts(cfg)]


DEPTH_SOURCE = f"{OWN_PREFIX}: test-time depth (not the paper's)"


def depth_rows(cfg) -> list[Claim]:
    """This project's own question, one row per trained K of the test_time_depth experiment: does
    StateLoop degrade less than Vanilla Looped past its trained depth (report/depth.py)? Negative:
    it does."""
    return [Claim(f"test_time_depth_degrades_less_K{K}", f"StateLoop degrades less than Vanilla Looped beyond its "
                  f"trained depth (trained K = {K})", DEPTH_SOURCE, "points of % PPL change from K to K*", -1, math.nan,
                  "not in the paper", lambda cfg, results, K=K: depth.degrades_less(depth.curves(cfg, results), K),
                  [depth.EXPERIMENT])
            for K in depth.trained_depths(cfg)]


def judge(cfg, results: Path) -> pd.DataFrame:
    """Every claim's row (``claims.csv``)."""
    rows = []
    own = token_trend_rows(cfg) + ladder_rows(cfg) + verdict_rows(cfg) + depth_rows(cfg)
    for c in paper_claims() + choice_rows() + own:
        out = c.measure(cfg, results)
        if out is None and c.source.startswith(("choice", "own")):
            continue  # an open choice or an own question the config does not measure
        row = {"id": c.id, "claim": c.claim, "source": c.source, "paper_effect": c.paper_effect,
               "paper_unit": c.paper_unit, "unit": c.unit}
        if out is None:
            missing = [e for e in c.experiments if e not in cfg.experiments]
            row.update(ours=math.nan, ci_lo=math.nan, ci_hi=math.nan, ci_half_width=math.nan, n=0, method="",
                       verdict=NOT_RUN, note=f"the config defines no {', '.join(missing) or 'matching'} experiment")
        else:
            est, note, *given = out
            verdict = given[0] if given else stats.verdict(est, c.paper_sign) if c.paper_sign else "-"
            row.update(ours=est.mean, ci_lo=est.lo, ci_hi=est.hi, ci_half_width=est.half_width, n=est.n,
                       method=est.method, verdict=verdict, note=note)
        rows.append(row)
    return pd.DataFrame(rows)


def to_markdown(df: pd.DataFrame, cfg, config_name: str) -> str:
    def num(v, digits=2) -> str:
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:+.{digits}f}"

    scales = sorted({r.scale for r in expand_runs(cfg)})
    seeds = sorted({r.seed for r in expand_runs(cfg)})
    ours = df.source.str.startswith(OWN_PREFIX)
    trend = df.source.isin([TOKENS_SOURCE, LADDER_SOURCE])
    counts, trend_counts = df[~ours].verdict.value_counts(), df[trend].verdict.value_counts()
    lines = ["# The paper's claims, judged", "",
             f"Config `{config_name}`, scale(s) {', '.join(scales)}, seeds {', '.join(map(str, seeds))}. "
             + ", ".join(f"{counts.get(v, 0)} {v}" for v in (stats.REPRODUCED, stats.CONTRADICTED, stats.INCONCLUSIVE, NOT_RUN)) + "."
             + (" The project's own trends over training tokens: "
                + ", ".join(f"{trend_counts.get(v, 0)} {v}" for v in (trends.SHRINKS, trends.GROWS, trends.HOLDS)) + "."
                if trend.any() else ""),
             "", "| claim | source | paper | ours [95% CI] | resolves | n | verdict | detail |", "|---|---|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        paper = f"{num(r.paper_effect)} {r.paper_unit}" if not math.isnan(r.paper_effect) else r.paper_unit
        if r.verdict == NOT_RUN:
            ours = "-"
        else:
            ours = f"{num(r.ours)}" + (f" [{num(r.ci_lo)}, {num(r.ci_hi)}]" if not math.isnan(r.ci_lo) else "") + f" {r.unit}"
        resolves = "-" if math.isnan(r.ci_half_width) else f"{r.ci_half_width:.2f}"
        lines.append(f"| {r.claim} | {r.source} | {paper} | {ours} | {resolves} | {r.n} | **{r.verdict}** | {r.note} |")
    lines += ["",
              "Verdicts: reproduced = our effect has the paper's sign and its 95% interval excludes 0; "
              "contradicted = the opposite sign, interval excluding 0; inconclusive = the interval contains 0 "
              "(or one seed: no interval). 'resolves' is the interval's half width: the smallest effect these "
              "seeds tell from 0. Effects are paired by seed (the same seed: the same init stream and "
              "data order), Table 3's by timed run; intervals are Student-t (stateloop.report.stats). Rows marked 'choice' measure "
              "an open choice both ways; they are not the paper's claims. Rows marked 'own' are the project's own "
              "questions, not the paper's: the slope of a paired PPL gap against log10 training tokens (each seed's "
              "least-squares slope over its validation points, then a t interval over seeds) or log10 training FLOPs "
              "(a compute ladder: least squares over every rung and seed); 'shrinks' = the slope excludes 0 on the "
              "side opposite to the final gap, 'grows' = on the same side, 'holds (no trend resolved)' = its "
              "interval contains 0; learning rate: the claim's verdict at each peak lr of the bracket, 'holds at "
              "every lr tried' or where it changes (ours: each model at its own best lr, paired by seed); the authors' "
              "recipe: the same, with the backbone initialised and warmed up as the authors' public configs do "
              "(the note gives the project's recipe at the same lrs and seeds); the paper runs' precision: the "
              "claim when both models train in bf16-mixed (the note gives float32 on the same seeds and the gap's "
              "change between them); test-time "
              "depth: StateLoop's PPL change from its trained K to K* = 2K (or the deepest "
              "depth evaluated below it) minus Vanilla Looped's, paired by seed.", ""]
    return "\n".join(lines)
