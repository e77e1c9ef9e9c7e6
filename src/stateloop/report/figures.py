"""Figures 2-4 in the paper's form, with the paper's stated values marked.

Every point of ours is a mean over seeds with its 95% interval as an error bar (band for a
reference line); the paper's points sit on a twin y-axis of their own (crimson), since its 410M
models and ours have different perplexity scales.

- loop_depth (Figure 2): held-out PPL against K for Vanilla Looped and StateLoop, and StateLoop's
  advantage (PPL(vanilla) / PPL(StateLoop) - 1, paired by seed); the paper states the advantage
  (in PPL) at K = 3 and K = 7.
- state_width (Figure 3): StateLoop's PPL against its parameter overhead over Vanilla Looped,
  points labelled by d_s and PPL (as the paper labels them), with Vanilla Looped as the reference line; the paper's 410M points
  from Table 4 are marked.
- state_analysis (Figure 4): (a) Shapley shares of the reads R_1..R_K, the paper's feedback /
  terminal split marked; (b) held-out PPL after single replacement and after freezing, per
  boundary, with the unmodified PPL (the run's held-out PPL of Table 4 on the same windows: "all
  analyses share an unmodified baseline") and the paper's three stated points.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stateloop.experiments import cells, expand_runs  # noqa: E402
from stateloop.models.registry import count_params  # noqa: E402
from stateloop.report import depth  # noqa: E402
from stateloop.report.stats import paired, relative_pct, t_interval, t_quantile  # noqa: E402
from stateloop.report.tables import _params, _runs, fact, heldout_by_seed, read_json, reference  # noqa: E402

PAPER_STYLE = dict(marker="*", s=140, color="crimson", zorder=5)
# Our runs and the paper's 410M models live on different PPL scales: the paper's points go on a
# twin y-axis (crimson, right) of their own, never on our axis.



def _paper_axis(ax, label: str):
    twin = ax.twinx()
    twin.set_ylabel(label, color="crimson")
    twin.tick_params(axis="y", colors="crimson")
    return twin


def _align_zero(ax, twin) -> None:
    """Put the twin axis's 0 at the height of ours, so "above 0" reads the same on both."""
    lo, hi = ax.get_ylim()
    tlo, thi = twin.get_ylim()
    thi = max(thi, 1e-9) * 1.1
    if lo < 0 < hi:
        twin.set_ylim(thi * lo / hi, thi)
    elif lo >= 0:
        twin.set_ylim(0, thi)


def _seeds_label(groups) -> str:
    n = sorted({len(rs) for rs in groups})
    return f"mean and 95% CI over {'/'.join(map(str, n))} seed(s)"


def loop_depth(cfg, results: Path):
    runs = _runs(cfg, "loop_depth")
    groups = list(cells(runs).values())
    curves: dict[str, dict[int, dict[int, float]]] = {}  # model -> K -> seed -> PPL
    for rs in groups:
        curves.setdefault(rs[0].model, {})[rs[0].K] = heldout_by_seed(results, rs)
    for needed in ("vanilla_looped", "stateloop"):
        if needed not in curves:
            raise KeyError(f"experiments.loop_depth.models: {needed} is missing (Figure 2 compares it)")
    Ks = sorted(set(curves["vanilla_looped"]) & set(curves["stateloop"]))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for model, style in (("vanilla_looped", "o-"), ("stateloop", "s-")):
        ks = sorted(curves[model])
        ests = [t_interval(list(curves[model][k].values())) for k in ks]
        ax.errorbar(ks, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=style, capsize=3, label=model)
    ax.set(xlabel="loop depth K", ylabel="held-out PPL (ours)", title=f"PPL against loop depth ({_seeds_label(groups)})")
    ax.legend(fontsize=8)
    # StateLoop's advantage in percent of Vanilla's PPL, paired by seed.
    adv = [paired(curves["vanilla_looped"][k], curves["stateloop"][k], relative_pct) for k in Ks]
    means = [e.mean for e in adv]
    ax2.errorbar(Ks, means, yerr=[e.bar for e in adv], fmt="d-", color="tab:green", capsize=3, label="ours (paired by seed)")
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set(xlabel="loop depth K", ylabel="PPL(vanilla) / PPL(StateLoop) - 1 (%)", title="StateLoop advantage")
    twin = _paper_axis(ax2, "paper: PPL(vanilla) - PPL(StateLoop), 410M")
    twin.scatter([3, 7], [fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K3"),
                          fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K7")], label="paper", **PAPER_STYLE)
    _align_zero(ax2, twin)
    for a in (ax, ax2):
        a.set_xticks(sorted(set(Ks) | set(curves["vanilla_looped"]) | set(curves["stateloop"])))
    ax2.legend(handles=ax2.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig


def state_width(cfg, results: Path):
    runs = _runs(cfg, "state_width")
    groups = sorted((rs for rs in cells(runs).values() if rs[0].model == "stateloop"), key=lambda rs: rs[0].d_s)
    if not groups:
        raise KeyError("experiments.state_width.models: stateloop is missing (Figure 3 sweeps its d_s)")
    K, scale = groups[0][0].K, groups[0][0].scale
    fig, ax = plt.subplots(figsize=(6.5, 4.0))
    # The overhead is over a vanilla model of the same shape; its PPL is drawn when the config trains one.
    base_params = count_params(dataclasses.replace(groups[0][0].model_config, name="vanilla_looped", d_state=0, options={}))
    vanilla = next((rs for rs in cells(expand_runs(cfg)).values()
                    if rs[0].model == "vanilla_looped" and rs[0].K == K and rs[0].scale == scale), None)
    if vanilla is not None:
        v = t_interval(list(heldout_by_seed(results, vanilla).values()))
        ax.axhline(v.mean, color="grey", ls="--", label=f"vanilla_looped (K={K})")
        if v.bar:
            ax.axhspan(v.lo, v.hi, color="grey", alpha=0.15)
    xs = [100 * (_params(rs[0]) / base_params - 1) for rs in groups]
    ests = [t_interval(list(heldout_by_seed(results, rs).values())) for rs in groups]
    ax.errorbar(xs, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="s-", capsize=3, label="stateloop")
    for rs, x, e in zip(groups, xs, ests):
        ax.annotate(f"d_s={rs[0].d_s}\nPPL {e.mean:.2f}", (x, e.mean), textcoords="offset points", xytext=(4, 4), fontsize=8)
    t4 = reference("table4_ablations")
    pv = float(t4[(t4.variant == "vanilla_looped")].pile_ppl.iloc[0])
    ps = float(t4[(t4.variant == "stateloop")].pile_ppl.iloc[0])
    vp = fact("fig3_state_width", "vanilla_params_m")
    sp = float(t4[(t4.variant == "stateloop")].params_m.iloc[0])
    twin = _paper_axis(ax, "paper: held-out PPL (410M)")
    twin.scatter([100 * (sp / vp - 1)], [ps], label="paper StateLoop d_s = d", **PAPER_STYLE)
    twin.scatter([0.0], [pv], marker="*", s=140, color="grey", zorder=5, label="paper vanilla")
    ax.set(xlabel="parameter overhead over vanilla (%)", ylabel="held-out PPL (ours)",
           title=f"State width (K={K}; {_seeds_label(groups)})")
    ax.legend(handles=ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], fontsize=7)
    fig.tight_layout()
    return fig


def state_analysis(cfg, results: Path):
    runs = _runs(cfg, "state_analysis")
    group = next((rs for rs in cells(runs).values() if rs[0].model == "stateloop"), None)
    if group is None:
        raise KeyError("experiments.state_analysis.models: stateloop is missing (Figure 4 analyses it)")
    shs = [read_json(results / "runs" / r.id / "shapley.json") for r in group]
    ivs = [read_json(results / "runs" / r.id / "interventions.json") for r in group]
    reads = shs[0]["reads"]
    K = len(reads)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.0))
    colors = ["tab:blue"] * (K - 1) + ["tab:orange"]
    shares = [t_interval([sh["share_pct"][k] for sh in shs]) for k in range(K)]
    ax.bar(reads, [e.mean for e in shares], yerr=[e.bar for e in shares], capsize=3, color=colors)
    fb = t_interval([sh["feedback_share_pct"] for sh in shs])
    ax.set(ylabel="share of total Shapley value (%)",
           title=f"(a) state reads: feedback {fb.format(1)}%, terminal {100 - fb.mean:.1f}%")
    ax.set_xlabel(f"paper (K=7): feedback {fact('fig4a_shapley', 'feedback_reads_share_pct'):.2f}%, "
                  f"terminal {fact('fig4a_shapley', 'terminal_read_share_pct'):.2f}%; ours: {_seeds_label([group])}",
                  color="crimson")
    for kind, style, label in (("replacement", "o-", r"replace $S^{i+1}$ by calibrated $S^i$"),
                               ("freezing", "s-", r"freeze $S^i$ after boundary $i$")):
        idx = [e["i"] for e in ivs[0][kind]]
        ests = [t_interval([{e["i"]: e["ppl"] for e in iv[kind]}[i] for iv in ivs]) for i in idx]
        ax2.errorbar(idx, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=style, capsize=3, label=label)
    held = t_interval([iv["heldout"]["ppl"] for iv in ivs])  # the run's held-out PPL (Table 4), same windows
    h0 = ivs[0]["heldout"]
    ax2.axhline(held.mean, color="grey", ls="--",
                label=f"unmodified {held.mean:.2f} (= held-out PPL; {h0['split']}, {h0['windows']} windows)")
    ax2.set(xlabel="boundary i", ylabel="held-out PPL (ours)", title="(b) replacement and freezing", yscale="log")
    twin = _paper_axis(ax2, "paper: PPL (410M, K=7)")
    twin.scatter([3, 3], [fact("fig4b_interventions", "replace_S4_with_calibrated_S3_ppl"),
                          fact("fig4b_interventions", "freeze_at_S3_ppl")], label="paper (i=3)", **PAPER_STYLE)
    twin.axhline(fact("fig4b_interventions", "unmodified_ppl"), color="crimson", ls=":", lw=0.8)
    twin.set_yscale("log")
    ax2.legend(handles=ax2.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], fontsize=7)
    fig.tight_layout()
    return fig


def gap_vs_tokens(cfg, results: Path):
    """The project's own figure (not the paper's): each PPL comparison's paired gap against training
    tokens (log axis), mean and 95% interval over seeds at every validation point, one panel per
    group of comparisons (report/trends.py), the fitted slope in each line's label."""
    from stateloop.report import trends

    comps = trends.comparisons(cfg)
    if not comps:
        raise KeyError("experiments: no PPL comparison to follow over tokens (table1, table4 or loop_depth)")
    groups = [g for g in trends.GROUPS if any(c.group == g for c in comps)]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.0), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for comp in (c for c in comps if c.group == group):
            curves = trends.gap_curves(results, comp)
            points = trends.pointwise(curves)
            if not points:
                continue
            xs = sorted(points)
            est = trends.slope(curves)
            fit = "no slope (one point)" if est is None else f"slope {est.format()}"
            line = ax.errorbar(xs, [points[x].mean for x in xs], yerr=[points[x].bar for x in xs], fmt="o-", ms=3,
                               capsize=2, label=f"{comp.label} ({len(curves)} seeds; {fit})")
            lo = [points[x].lo if points[x].bar else points[x].mean for x in xs]
            hi = [points[x].hi if points[x].bar else points[x].mean for x in xs]
            ax.fill_between(xs, lo, hi, color=line[0].get_color(), alpha=0.12)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set(xlabel="training tokens", ylabel="PPL gap, paired by seed (%)", title=group)
        ax.legend(fontsize=6)
    fig.suptitle("Paired PPL gap over training (ours; mean and 95% CI over seeds; slope per 10x tokens)", fontsize=9)
    fig.tight_layout()
    return fig


DIAGNOSTIC_PANELS = (("write_rate_mean", "write rate 1 - g^k (mean over channels)"),
                     ("write_rate_sd", "write rate: sd over channels"),
                     ("read_ratio", "||R_i|| / ||H^(i-1)|| (i = K: terminal read)"),
                     ("state_norm", "||S^i||"))


def state_diagnostics(cfg, results: Path):
    """The project's own figure (not the paper's): what the state of each trained StateLoop-family
    cell does over the iterations (eval.json's ``state``, evaluate/diagnostics.py), mean and 95%
    interval over seeds per state index i; a quantity a model lacks (the GRU's write rate,
    state-only's reads) is not drawn for it."""
    from stateloop.models.registry import get_spec
    from stateloop.report.outputs import OUTPUTS

    experiments = [e for e in OUTPUTS["state_diagnostics"].experiments if e in cfg.experiments and cfg.experiments[e].trained]
    groups = [rs for rs in cells(expand_runs(cfg, experiments)).values() if get_spec(rs[0].model).has_state] if experiments else []
    if not groups:
        raise KeyError("experiments: no trained StateLoop-family run to diagnose (table4, loop_depth or table1)")
    fig, axes = plt.subplots(1, len(DIAGNOSTIC_PANELS), figsize=(4.2 * len(DIAGNOSTIC_PANELS), 4.2))
    handles = {}  # one legend entry per cell, whichever panels it appears in
    for n, rs in enumerate(groups):
        diags = []
        for run in rs:
            path = results / "runs" / run.id / "eval.json"
            state = read_json(path).get("state")
            if state is None:
                raise KeyError(f"{path}: no 'state' diagnostics (evaluated before they were recorded: run `stateloop eval` again)")
            diags.append(state)
        label = f"{rs[0].model} K={rs[0].K}" + (f" d_s={rs[0].d_s}" if rs[0].d_s != groups[0][0].d_s else "")
        color = f"C{n % 10}"  # the same colour in every panel
        for ax, (key, _) in zip(axes, DIAGNOSTIC_PANELS):
            if key not in diags[0]:
                continue
            idx = diags[0]["states"]
            ests = [t_interval([d[key][j] for d in diags]) for j in range(len(idx))]
            handles[label] = ax.errorbar(idx, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="o-", ms=3,
                                         capsize=2, label=label, color=color)
            if key == "read_ratio":  # the terminal read R_K, a projection of its own
                ax.scatter([idx[-1]], [ests[-1].mean], marker="s", s=40, facecolors="none", edgecolors=color)
    for ax, (key, title) in zip(axes, DIAGNOSTIC_PANELS):
        ax.set(xlabel="state index i (S^i after iteration i - 1)", title=title)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        if key.startswith("write_rate"):
            ax.set_ylim(bottom=0)
    fig.legend(handles=list(handles.values()), labels=list(handles), fontsize=7, loc="lower center",
               ncol=min(len(handles), 6))
    fig.suptitle(f"The state over the iterations (ours, held-out windows; {_seeds_label(groups)}; "
                 "open square: the terminal read)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06 * math.ceil(len(handles) / 6), 1, 1))
    return fig


def gap_vs_compute(cfg, results: Path):
    """The project's own figure (not the paper's): StateLoop's paired PPL gap to Vanilla Looped at
    each rung of a compute ladder against training FLOPs (log axis), one line per K with its
    95% interval over seeds, the fitted trend with its 95% band and crossing, and the paper's two
    points on the same axes (report/ladder.py)."""
    from stateloop.report import ladder

    Ks = ladder.loop_counts(cfg)
    if not Ks:
        raise KeyError(f"experiments: no ladder rung ({', '.join(ladder.RUNGS)}) trains {ladder.MODEL}")
    paper = ladder.paper_points()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for n, K in enumerate(Ks):
        tr = ladder.trend(cfg, results, K)
        color = f"C{n % 10}"
        ests = [t_interval(list(r.gaps.values()), what="paired seeds") for r in tr.rungs]
        xs = [r.flops for r in tr.rungs]
        ax.errorbar(xs, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="o", capsize=3, color=color,
                    label=f"ours, K={K} ({_seeds_label([list(r.gaps) for r in tr.rungs])})")
        if tr.fit is not None:  # the trend and its band, over our rungs and out to the paper's point
            span = [math.log10(x) for x in xs + ([paper[K][0]] if K in paper else [])]
            lo, hi = min(span), max(span)
            grid = [lo + (hi - lo) * i / 50 for i in range(51)]
            t = t_quantile(tr.fit.dof + 1) if tr.fit.dof > 0 else math.nan
            ax.plot([10 ** g for g in grid], [tr.fit.predict(g) for g in grid], "-", color=color, lw=1,
                    label=f"fit K={K}: slope {tr.slope.format()} per 10x; {tr.crossing_text()}")
            if not math.isnan(t):
                ax.fill_between([10 ** g for g in grid], [tr.fit.predict(g) - t * tr.fit.se(g) for g in grid],
                                [tr.fit.predict(g) + t * tr.fit.se(g) for g in grid], color=color, alpha=0.12)
        if K in paper:
            ax.scatter([paper[K][0]], [paper[K][1]], label=f"paper, K={K} ({'1.4B, Table 1' if K == 4 else '410M, Table 4'})",
                       edgecolors=color, **PAPER_STYLE)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set(xlabel="training FLOPs (forward + backward, the project's count)",
           ylabel="PPL(StateLoop) / PPL(Vanilla Looped) - 1 (%)", title="StateLoop's gap against training compute (ours)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


FIGURES = {"loop_depth": loop_depth, "state_width": state_width, "state_analysis": state_analysis,
           "gap_vs_tokens": gap_vs_tokens, "state_diagnostics": state_diagnostics, "gap_vs_compute": gap_vs_compute,
           "test_time_depth": depth.figure}
