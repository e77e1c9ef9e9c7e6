"""Figures 2-4 in the paper's form, with the paper's stated values marked.

Every point of ours is a mean over seeds with its 95% interval as an error bar (band for a
reference line); the paper's points sit on a twin y-axis of their own (vermillion stars), since its
410M models and ours have different perplexity scales. Sizes, fonts and colours: report/style.py.

Figure 4b's unmodified PPL is the run's held-out PPL of Table 4 on the same windows ("all
analyses share an unmodified baseline").
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path

from matplotlib.patches import Patch

from stateloop.experiments import cells, expand_runs
from stateloop.models.registry import count_params, get_spec
from stateloop.report import depth, ladder, lr, style, trends
from stateloop.report.outputs import OUTPUTS, baseline_of
from stateloop.report.stats import paired, relative_pct, t_interval, t_quantile
from stateloop.report.tables import _params, _runs, fact, heldout_by_seed, read_json, reference

# Our runs and the paper's 410M models live on different PPL scales: the paper's points go on a
# twin y-axis (style.PAPER, right) of their own, never on our axis.
PAPER_OPEN = dict(style.PAPER_STAR, color="white", edgecolors=style.PAPER, linewidths=0.8)  # the paper's reference model


def _paper_axis(ax, label: str):
    twin = ax.twinx()
    twin.set_ylabel(label, color=style.PAPER)
    twin.tick_params(axis="y", colors=style.PAPER)
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
    return style.seeds_text(len(rs) for rs in groups)


def _legend_below(ax, handles, ncol: int = 1):
    """The legend under the axes (constrained layout makes room), off the data."""
    return ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol)


def _colour(model: str, i: int) -> str:
    """The model's own colour (style.MODEL_COLOURS), else the i-th of style.SEQUENCE: two models no
    figure knew are told apart."""
    return style.MODEL_COLOURS.get(model) or style.SEQUENCE[i % len(style.SEQUENCE)]


def depth_panels(curves: dict[str, dict[int, dict[int, float]]], baseline: str, models: list[str],
                 labels: dict[str, str] | None = None):
    """Figure 2's two panels, (fig, ax, ax2), for ``curves`` (model -> K -> seed -> held-out PPL):
    (a) each model's PPL against K, its mean and 95% interval over seeds; (b) each other model's
    advantage over ``baseline``, 100 (PPL_baseline / PPL_model - 1) paired by seed at each K both
    have, labelled ``labels[model]`` (default: the model, paired by seed). Figure 2 and every
    experiment's own comparison (:func:`comparison`) draw these; the caller adds panel (b)'s
    label and title."""
    labels = labels or {}
    fig, (ax, ax2) = style.subplots(1, 2, width=style.FULL, height=2.7)
    for i, model in enumerate(models):
        ks = sorted(curves[model])
        ests = [t_interval(list(curves[model][k].values())) for k in ks]
        ax.errorbar(ks, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=f"{MARKERS[i % len(MARKERS)]}-",
                    color=_colour(model, i), label=model)
    ax.set(xlabel="loop depth K", ylabel="held-out PPL (ours)", title="(a) PPL against loop depth")
    ax.set_xticks(sorted(set().union(*(curves[m] for m in models))))
    ax.legend()
    drawn: set[int] = set()
    for i, model in enumerate(models):
        Ks = sorted(set(curves[baseline]) & set(curves[model]))
        if model == baseline or not Ks:
            continue
        drawn |= set(Ks)
        adv = [paired(curves[baseline][k], curves[model][k], relative_pct) for k in Ks]
        ax2.errorbar(Ks, [e.mean for e in adv], yerr=[e.bar for e in adv], fmt=f"{MARKERS[i % len(MARKERS)]}-",
                     color=_colour(model, i), label=labels.get(model, f"{model} (paired by seed)"))
    ax2.axhline(0, color=style.GREY, lw=0.6)
    ax2.set(xlabel="loop depth K")
    ax2.set_xticks(sorted(drawn))
    return fig, ax, ax2


def comparison(cfg, results: Path, name: str):
    """Experiment ``name``'s own comparison as a figure, in Figure 2's form (:func:`depth_panels`):
    where it varies K (report/outputs.py: varies_K), each model's PPL against K and each one's
    advantage over the experiment's baseline, paired by seed; one curve per model and state width."""
    baseline = baseline_of(cfg, name)
    groups = list(cells(_runs(cfg, name)).values())
    curves: dict[str, dict[int, dict[int, float]]] = {}  # curve -> K -> seed -> PPL
    widths = {rs[0].model: {r.d_s for g in groups for r in g if r.model == rs[0].model} for rs in groups}
    for rs in groups:
        r = rs[0]
        key = r.model if len(widths[r.model]) == 1 else f"{r.model} d_s={r.d_s}"
        curves.setdefault(key, {})[r.K] = heldout_by_seed(results, rs)
    base = next(k for k in curves if k == baseline or k.startswith(f"{baseline} d_s="))
    fig, ax, ax2 = depth_panels(curves, base, list(curves))
    ax2.set(ylabel=f"PPL({base}) / PPL(model) - 1 (%)", title=f"(b) advantage over {base}")
    ax2.legend(loc="best")
    fig.suptitle(f"{name}: held-out PPL against loop depth (ours: {_seeds_label(groups)}; above 0: lower PPL than {base})")
    return fig


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
    # StateLoop's advantage in percent of Vanilla's PPL, paired by seed.
    fig, ax, ax2 = depth_panels(curves, "vanilla_looped", ["vanilla_looped", "stateloop"],
                                {"stateloop": "ours (paired by seed)"})
    ax2.set(ylabel="PPL(vanilla) / PPL(StateLoop) - 1 (%)", title="(b) StateLoop's advantage")
    twin = _paper_axis(ax2, "paper (410M):\nPPL(vanilla) - PPL(StateLoop)")
    paper_Ks = [3, 7]
    twin.scatter(paper_Ks, [fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K3"),
                            fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K7")], label="paper", **style.PAPER_STAR)
    _align_zero(ax2, twin)
    ax2.set_xticks(sorted(set(Ks) | set(paper_Ks)))
    ax2.legend(handles=ax2.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], loc="lower left")
    fig.suptitle(f"Held-out PPL against loop depth (ours: {_seeds_label(groups)}; paper: stars, right axis)")
    return fig


def state_width(cfg, results: Path):
    runs = _runs(cfg, "state_width")
    groups = sorted((rs for rs in cells(runs).values() if rs[0].model == "stateloop"), key=lambda rs: rs[0].d_s)
    if not groups:
        raise KeyError("experiments.state_width.models: stateloop is missing (Figure 3 sweeps its d_s)")
    K, scale = groups[0][0].K, groups[0][0].scale
    fig, ax = style.subplots(width=style.COLUMN, height=3.0)
    # The overhead is over a vanilla model of the same shape; its PPL is drawn when the config trains one.
    base_params = count_params(dataclasses.replace(groups[0][0].model_config, name="vanilla_looped", d_s=0, options={}))
    vanilla = next((rs for rs in cells(expand_runs(cfg)).values()
                    if rs[0].model == "vanilla_looped" and rs[0].K == K and rs[0].scale == scale), None)
    if vanilla is not None:
        v = t_interval(list(heldout_by_seed(results, vanilla).values()))
        colour = style.model_colour("vanilla_looped")
        ax.axhline(v.mean, color=colour, ls="--", lw=0.8, label=f"vanilla_looped (K={K})")
        if v.bar:
            ax.axhspan(v.lo, v.hi, color=colour, alpha=0.1, lw=0)
    xs = [100 * (_params(rs[0]) / base_params - 1) for rs in groups]
    ests = [t_interval(list(heldout_by_seed(results, rs).values())) for rs in groups]
    ax.errorbar(xs, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="s-", color=style.model_colour("stateloop"),
                label="stateloop")
    # Labels alternate above and below their points' error bars (neighbours at small overheads sit
    # close), and the margins keep them inside the axes, clear of the title.
    for n, (rs, x, e) in enumerate(zip(groups, xs, ests)):
        above = n % 2 == 0
        ax.annotate(f"d_s={rs[0].d_s}\nPPL {e.mean:.2f}", (x, e.mean + (e.bar if above else -e.bar)), textcoords="offset points",
                    xytext=(0, 5 if above else -5), ha="center", va="bottom" if above else "top", fontsize=6)
    ax.margins(x=0.18, y=0.35)
    t4 = reference("table4_ablations")
    pv = float(t4[(t4.variant == "vanilla_looped")].pile_ppl.iloc[0])
    ps = float(t4[(t4.variant == "stateloop")].pile_ppl.iloc[0])
    vp = fact("fig3_state_width", "vanilla_params_m")
    sp = float(t4[(t4.variant == "stateloop")].params_m.iloc[0])
    twin = _paper_axis(ax, "paper: held-out PPL (410M)")
    twin.scatter([100 * (sp / vp - 1)], [ps], label="paper StateLoop d_s = d", **style.PAPER_STAR)
    twin.scatter([0.0], [pv], label="paper vanilla", **PAPER_OPEN)
    twin.margins(y=0.35)
    ax.set(xlabel="parameter overhead over vanilla (%)", ylabel="held-out PPL (ours)",
           title=f"State width (K={K}; {_seeds_label(groups)})")
    _legend_below(ax, ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], ncol=2)
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
    fig, (ax, ax2) = style.subplots(1, 2, width=style.FULL, height=3.0)
    feedback, terminal = style.SEQUENCE[:2]
    shares = [t_interval([sh["share_pct"][k] for sh in shs]) for k in range(K)]
    bars = [e.bar for e in shares] if any(e.bar for e in shares) else None  # one seed: no bar, not a flat cap
    ax.bar(reads, [e.mean for e in shares], yerr=bars, capsize=2, color=[feedback] * (K - 1) + [terminal])
    fb = t_interval([sh["feedback_share_pct"] for sh in shs])
    paper_fb, paper_term = fact("fig4a_shapley", "feedback_reads_share_pct"), fact("fig4a_shapley", "terminal_read_share_pct")
    ax.set(xlabel="state read", ylabel="share of total Shapley value (%)", title="(a) Shapley values of the state reads")
    _legend_below(ax, [Patch(color=feedback, label=f"feedback R1-R{K - 1}: {fb.format(1)}% (paper, K=7: {paper_fb:.2f}%)"),
                       Patch(color=terminal, label=f"terminal R{K}: {100 - fb.mean:.1f}% (paper: {paper_term:.2f}%)")])
    for (kind, fmt, label), colour in zip((("replacement", "o-", r"replace $S^{i+1}$ by calibrated $S^i$"),
                                           ("freezing", "s-", r"freeze $S^i$ after boundary $i$")), style.SEQUENCE[2:]):
        idx = [e["i"] for e in ivs[0][kind]]
        ests = [t_interval([{e["i"]: e["ppl"] for e in iv[kind]}[i] for iv in ivs]) for i in idx]
        ax2.errorbar(idx, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=fmt, color=colour, label=label)
    held = t_interval([iv["heldout"]["ppl"] for iv in ivs])  # the run's held-out PPL (Table 4), same windows
    h0 = ivs[0]["heldout"]
    ax2.axhline(held.mean, color=style.model_colour("stateloop"), ls="--", lw=0.8,
                label=f"unmodified {held.mean:.2f} (held-out PPL; {h0['split']}, {h0['windows']} windows)")
    ax2.set(xlabel="boundary i", ylabel="held-out PPL (ours)", title="(b) replacement and freezing", yscale="log")
    style.integer_axis(ax2.xaxis)  # boundaries are whole
    style.plain_log_axis(ax2.yaxis)
    twin = _paper_axis(ax2, "paper: PPL (410M, K=7)")
    twin.scatter([3, 3], [fact("fig4b_interventions", "replace_S4_with_calibrated_S3_ppl"),
                          fact("fig4b_interventions", "freeze_at_S3_ppl")], label="paper (i=3)", **style.PAPER_STAR)
    twin.axhline(fact("fig4b_interventions", "unmodified_ppl"), color=style.PAPER, ls=":", lw=0.8, label="paper: unmodified")
    twin.set_yscale("log")
    style.plain_log_axis(twin.yaxis)
    _legend_below(ax2, ax2.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0], ncol=2)
    fig.suptitle(f"The state of StateLoop (ours: K={K}, {_seeds_label([group])}; paper: stars, right axis)")
    return fig


LINESTYLES = ("-", "--", ":", "-.")  # one per loop count where a model's colour repeats
MARKERS = ("o", "s", "^", "D")


def gap_vs_tokens(cfg, results: Path):
    """The project's own figure (not the paper's): each PPL comparison's paired gap against training
    tokens (log axis), mean and 95% interval over seeds at every validation point, one panel per
    group of comparisons (report/trends.py), the fitted slope in each line's label."""
    comps = trends.comparisons(cfg)
    if not comps:
        raise KeyError("experiments: no PPL comparison to follow over tokens (table1, table4 or loop_depth)")
    groups = [g for g in trends.GROUPS if any(c.group == g for c in comps)]
    Ks = sorted({c.ours[0].K for c in comps})
    fig, axes = style.subplots(len(groups), 1, width=style.FULL, height=0.4 + 1.7 * len(groups), squeeze=False)
    seeds = set()
    for ax, group in zip(axes[:, 0], groups):
        for comp in (c for c in comps if c.group == group):
            curves = trends.gap_curves(results, comp)
            points = trends.pointwise(curves)
            if not points:
                continue
            seeds.add(len(curves))
            xs = sorted(points)
            est = trends.slope(curves)
            fit = "no slope (one point)" if est is None else f"slope {est.format()}"
            n = Ks.index(comp.ours[0].K)
            # the model the comparison is about: the variant or ablation, StateLoop against Vanilla, Vanilla + FFN
            colour = style.model_colour(comp.against if comp.model == "stateloop" and comp.against != "vanilla_looped"
                                        else comp.model)
            ax.errorbar(xs, [points[x].mean for x in xs], yerr=[points[x].bar for x in xs], fmt=MARKERS[n % 4],
                        ls=LINESTYLES[n % 4], ms=3, color=colour, label=f"{comp.label} ({fit})")
            lo = [points[x].lo if points[x].bar else points[x].mean for x in xs]
            hi = [points[x].hi if points[x].bar else points[x].mean for x in xs]
            ax.fill_between(xs, lo, hi, color=colour, alpha=0.12, lw=0)
        ax.axhline(0, color=style.GREY, lw=0.6)
        ax.set_xscale("log")
        ax.set(xlabel="training tokens", ylabel="PPL gap (%)", title=group)
        ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"Paired PPL gap over training (ours; {style.seeds_text(seeds)}; slope per 10x tokens)")
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
    experiments = [e for e in OUTPUTS["state_diagnostics"].experiments if e in cfg.experiments and cfg.experiments[e].trained]
    groups = [rs for rs in cells(expand_runs(cfg, experiments)).values() if get_spec(rs[0].model).has_state] if experiments else []
    if not groups:
        raise KeyError("experiments: no trained StateLoop-family run to diagnose (table4, loop_depth or table1)")
    fig, axes = style.subplots(2, 2, width=style.FULL, height=4.6)
    axes = list(axes.flat)
    handles = {}  # one legend entry per cell, whichever panels it appears in
    Ks = sorted({rs[0].K for rs in groups})
    for rs in groups:
        diags = []
        for run in rs:
            path = results / "runs" / run.id / "eval.json"
            state = read_json(path).get("state")
            if state is None:
                raise KeyError(f"{path}: no 'state' diagnostics (evaluated before they were recorded: run `stateloop eval` again)")
            diags.append(state)
        label = f"{rs[0].model} K={rs[0].K}" + (f" d_s={rs[0].d_s}" if rs[0].d_s != groups[0][0].d_s else "")
        color = style.model_colour(rs[0].model)  # the same colour in every panel
        n = Ks.index(rs[0].K)
        for ax, (key, _) in zip(axes, DIAGNOSTIC_PANELS):
            if key not in diags[0]:
                continue
            idx = diags[0]["states"]
            ests = [t_interval([d[key][j] for d in diags]) for j in range(len(idx))]
            handles[label] = ax.errorbar(idx, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt=MARKERS[n % 4],
                                         ls=LINESTYLES[n % 4], ms=3, label=label, color=color)
            if key == "read_ratio":  # the terminal read R_K, a projection of its own
                ax.scatter([idx[-1]], [ests[-1].mean], marker="s", s=30, facecolors="none", edgecolors=color)
    for ax, (key, title) in zip(axes, DIAGNOSTIC_PANELS):
        ax.set(xlabel="state index i (S^i after iteration i - 1)", title=title)
        style.integer_axis(ax.xaxis)
        if key.startswith("write_rate"):
            ax.set_ylim(bottom=0)
    fig.legend(handles=list(handles.values()), labels=list(handles), loc="outside lower center", ncol=min(len(handles), 4))
    fig.suptitle(f"The state over the iterations (ours, held-out windows; {_seeds_label(groups)}; "
                 "open square: the terminal read)")
    return fig


def gap_vs_compute(cfg, results: Path):
    """The project's own figure (not the paper's): StateLoop's paired PPL gap to Vanilla Looped at
    each rung of a compute ladder against training FLOPs (log axis), one line per K with its
    95% interval over seeds, the fitted trend with its 95% band and crossing, and the paper's two
    points on the same axes (report/ladder.py)."""
    Ks = ladder.loop_counts(cfg)
    if not Ks:
        raise KeyError(f"experiments: no ladder rung ({', '.join(ladder.RUNGS)}) trains {ladder.MODEL}")
    paper = ladder.paper_points()
    fig, ax = style.subplots(width=style.FULL, height=3.6)
    for n, K in enumerate(Ks):
        tr = ladder.trend(cfg, results, K)
        color = style.SEQUENCE[n % len(style.SEQUENCE)]
        ests = [t_interval(list(r.gaps.values()), what="paired seeds") for r in tr.rungs]
        xs = [r.flops for r in tr.rungs]
        ax.errorbar(xs, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="o", color=color,
                    label=f"ours, K={K} ({_seeds_label([list(r.gaps) for r in tr.rungs])})")
        if tr.fit is not None:  # the trend and its band, over our rungs and out to the paper's point
            span = [math.log10(x) for x in xs + ([paper[K][0]] if K in paper else [])]
            lo, hi = min(span), max(span)
            grid = [lo + (hi - lo) * i / 50 for i in range(51)]
            t = t_quantile(tr.fit.dof + 1) if tr.fit.dof > 0 else math.nan
            ax.plot([10 ** g for g in grid], [tr.fit.predict(g) for g in grid], "-", color=color, lw=1,
                    label=textwrap.fill(f"fit K={K}: slope {tr.slope.format()} per 10x; {tr.crossing_text()}", 100))
            if not math.isnan(t):
                ax.fill_between([10 ** g for g in grid], [tr.fit.predict(g) - t * tr.fit.se(g) for g in grid],
                                [tr.fit.predict(g) + t * tr.fit.se(g) for g in grid], color=color, alpha=0.12, lw=0)
        if K in paper:
            ax.scatter([paper[K][0]], [paper[K][1]], label=f"paper, K={K} ({'1.4B, Table 1' if K == 4 else '410M, Table 4'})",
                       **dict(style.PAPER_STAR, edgecolors=color, linewidths=1.0))
    ax.axhline(0, color=style.GREY, lw=0.6)
    ax.set_xscale("log")
    ax.set(xlabel="training FLOPs (forward + backward, the project's count)",
           ylabel="PPL(StateLoop) / PPL(Vanilla Looped) - 1 (%)", title="StateLoop's gap against training compute (ours)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center")
    return fig


FIGURES = {"loop_depth": loop_depth, "state_width": state_width, "state_analysis": state_analysis,
           "gap_vs_tokens": gap_vs_tokens, "state_diagnostics": state_diagnostics, "gap_vs_compute": gap_vs_compute,
           "test_time_depth": depth.figure, "lr_sweep": lr.figure}
