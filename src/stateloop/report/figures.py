"""Figures 2-4 in the paper's form, with the paper's stated values marked.

- loop_depth (Figure 2): held-out PPL against K for Vanilla Looped and StateLoop, and StateLoop's
  advantage (vanilla - stateloop); the paper states the advantage at K = 3 and K = 7.
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
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from stateloop.experiments import expand_runs  # noqa: E402
from stateloop.models.registry import count_params  # noqa: E402
from stateloop.report.tables import _params, _runs, read_json, reference  # noqa: E402

PAPER_STYLE = dict(marker="*", s=140, color="crimson", zorder=5, label="paper")


def _fact(figure: str, quantity: str) -> float:
    facts = reference("figures_text")
    row = facts[(facts.figure == figure) & (facts.quantity == quantity)]
    return float(row.value.iloc[0])


def _ppl(results: Path, run) -> float:
    return read_json(results / "runs" / run.id / "eval.json")["heldout"]["ppl"]


def loop_depth(cfg, results: Path):
    runs = _runs(cfg, "loop_depth")
    curves: dict[str, dict[int, float]] = {}
    for run in runs:
        curves.setdefault(run.model, {})[run.K] = _ppl(results, run)
    for needed in ("vanilla_looped", "stateloop"):
        if needed not in curves:
            raise KeyError(f"experiments.loop_depth.models: {needed} is missing (Figure 2 compares it)")
    Ks = sorted(set(curves["vanilla_looped"]) & set(curves["stateloop"]))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for model, style in (("vanilla_looped", "o-"), ("stateloop", "s-")):
        ks = sorted(curves[model])
        ax.plot(ks, [curves[model][k] for k in ks], style, label=model)
    ax.set(xlabel="loop depth K", ylabel="held-out PPL", title="PPL against loop depth")
    ax.legend()
    adv = [curves["vanilla_looped"][k] - curves["stateloop"][k] for k in Ks]
    ax2.plot(Ks, adv, "d-", color="tab:green", label="ours")
    ax2.scatter([3, 7], [_fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K3"),
                         _fact("fig2_loop_depth", "stateloop_ppl_advantage_at_K7")], **PAPER_STYLE)
    ax2.axhline(0, color="grey", lw=0.8)
    ax2.set(xlabel="loop depth K", ylabel="PPL(vanilla) - PPL(StateLoop)", title="StateLoop advantage")
    ax2.legend()
    fig.tight_layout()
    return fig


def state_width(cfg, results: Path):
    runs = _runs(cfg, "state_width")
    points = sorted((run.d_s, run) for run in runs if run.model == "stateloop")
    if not points:
        raise KeyError("experiments.state_width.models: stateloop is missing (Figure 3 sweeps its d_s)")
    K, scale = points[0][1].K, points[0][1].scale
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    # The overhead is over a vanilla model of the same shape; its PPL is drawn when the config trains one.
    base_params = count_params(dataclasses.replace(points[0][1].model_config, name="vanilla_looped", d_state=0, options={}))
    vanilla = next((r for r in expand_runs(cfg) if r.model == "vanilla_looped" and r.K == K and r.scale == scale), None)
    if vanilla is not None:
        ax.axhline(_ppl(results, vanilla), color="grey", ls="--", label=f"vanilla_looped (K={K})")
    xs = [100 * (_params(run) / base_params - 1) for _, run in points]
    ys = [_ppl(results, run) for _, run in points]
    ax.plot(xs, ys, "s-", label="stateloop")
    for (d_s, _), x, y in zip(points, xs, ys):
        ax.annotate(f"d_s={d_s}\nPPL {y:.2f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    t4 = reference("table4_ablations")
    v = float(t4[(t4.variant == "vanilla_looped")].pile_ppl.iloc[0])
    s = float(t4[(t4.variant == "stateloop")].pile_ppl.iloc[0])
    vp = _fact("fig3_state_width", "vanilla_params_m")
    sp = float(t4[(t4.variant == "stateloop")].params_m.iloc[0])
    ax.scatter([100 * (sp / vp - 1)], [s], **PAPER_STYLE)
    ax.scatter([0.0], [v], marker="*", s=140, color="grey", zorder=5, label="paper vanilla (410M)")
    ax.set(xlabel="parameter overhead over vanilla (%)", ylabel="held-out PPL", title=f"State width (K={K})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def state_analysis(cfg, results: Path):
    runs = _runs(cfg, "state_analysis")
    run = next((r for r in runs if r.model == "stateloop"), None)
    if run is None:
        raise KeyError("experiments.state_analysis.models: stateloop is missing (Figure 4 analyses it)")
    sh = read_json(results / "runs" / run.id / "shapley.json")
    iv = read_json(results / "runs" / run.id / "interventions.json")
    K = len(sh["reads"])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = ["tab:blue"] * (K - 1) + ["tab:orange"]
    ax.bar(sh["reads"], sh["share_pct"], color=colors)
    ax.set(ylabel="share of total Shapley value (%)",
           title=f"(a) state reads: feedback {sh['feedback_share_pct']:.1f}%, terminal {sh['terminal_share_pct']:.1f}%")
    ax.set_xlabel(f"paper (K=7): feedback {_fact('fig4a_shapley', 'feedback_reads_share_pct'):.2f}%, "
                  f"terminal {_fact('fig4a_shapley', 'terminal_read_share_pct'):.2f}%", color="crimson")
    rep = iv["replacement"]
    frz = iv["freezing"]
    ax2.plot([e["i"] for e in rep], [e["ppl"] for e in rep], "o-", label=r"replace $S^{i+1}$ by calibrated $S^i$")
    ax2.plot([e["i"] for e in frz], [e["ppl"] for e in frz], "s-", label=r"freeze $S^i$ after boundary $i$")
    held = iv["heldout"]  # the same windows and number as the run's held-out PPL (Table 4)
    ax2.axhline(held["ppl"], color="grey", ls="--",
                label=f"unmodified {held['ppl']:.2f} (= held-out PPL; {held['split']}, {held['windows']} windows)")
    ax2.scatter([3, 3], [_fact("fig4b_interventions", "replace_S4_with_calibrated_S3_ppl"),
                         _fact("fig4b_interventions", "freeze_at_S3_ppl")], **PAPER_STYLE)
    ax2.set(xlabel="boundary i", ylabel="held-out PPL", title="(b) replacement and freezing", yscale="log")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


FIGURES = {"loop_depth": loop_depth, "state_width": state_width, "state_analysis": state_analysis}
