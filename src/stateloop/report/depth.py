"""Test-time depth: trained runs evaluated at other loop counts K' than their trained K.

This is the project's own study, not one of the paper's (which evaluates every model "at the
depth used during training"). The runs of the experiment ``test_time_depth`` carry
``test_time_K``; each run folder's ``eval_depth.json`` (``stateloop eval RUN --depths ...``)
holds its held-out perplexity at every K'. Here:

- :func:`figure`: held-out PPL against K', one panel per model, one line per trained K (mean
  over seeds with its 95% interval), the trained depth marked on each line.
- :func:`claim_rows`: per trained K, does StateLoop degrade less than Vanilla Looped beyond its
  trained depth? The degradation of a run is ``100 (PPL(K*) / PPL(K) - 1)`` at K* = 2K, or the
  deepest K' below 2K the experiment evaluates past K; the effect is StateLoop's degradation minus
  Vanilla's, paired by seed (negative: StateLoop degrades less).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.lines import Line2D

from stateloop.experiments import cells, expand_runs
from stateloop.models.registry import get_spec
from stateloop.report import style
from stateloop.report.stats import paired, relative_pct, t_interval
from stateloop.report.tables import read_json
from stateloop.runs import DEPTH_FILE

EXPERIMENT = "test_time_depth"


def curves(cfg, results: Path) -> dict[str, dict[int, dict[int, dict[int, float]]]]:
    """{model: {trained K: {seed: {K': held-out PPL}}}} over the experiment's runs."""
    if EXPERIMENT not in cfg.experiments:
        raise KeyError(f"experiments.{EXPERIMENT}: the config defines no such experiment (needed by this figure)")
    out: dict = {}
    for run in expand_runs(cfg, [EXPERIMENT]):
        sweep = read_json(Path(results) / "runs" / run.id / DEPTH_FILE)
        out.setdefault(run.model, {}).setdefault(run.K, {})[run.seed] = {
            p["K"]: p["heldout"]["ppl"] for p in sweep["depths"]}
    return out


def deepest_beyond(K: int, depths) -> int | None:
    """K* of a run trained at K: 2K when evaluated, else the deepest evaluated K' in (K, 2K);
    None when no evaluated depth lies past K (and within 2K)."""
    past = [k for k in depths if K < k <= 2 * K]
    return max(past) if past else None


def degradation(by_depth: dict[int, float], K: int) -> float | None:
    """``100 (PPL(K*) / PPL(K) - 1)`` of one run (None without K or K* among its depths)."""
    star = deepest_beyond(K, by_depth)
    if star is None or K not in by_depth:
        return None
    return relative_pct(by_depth[star], by_depth[K])


def degrades_less(curves_: dict, K: int, model: str = "stateloop", against: str = "vanilla_looped"):
    """(Estimate of model's degradation minus against's, paired by seed; note) at trained K, or
    None when either model lacks runs at K or depths past K."""
    if K not in curves_.get(model, {}) or K not in curves_.get(against, {}):
        return None
    ours, theirs = ({s: v for s, c in curves_[m][K].items() if (v := degradation(c, K)) is not None} for m in (model, against))
    if not ours or not theirs:
        return None
    star = deepest_beyond(K, next(iter(curves_[model][K].values())))
    est = paired(ours, theirs)
    mean = lambda d: sum(d.values()) / len(d)  # noqa: E731
    return est, f"PPL at K'={star} vs K={K}: {model} {mean(ours):+.1f}%, {against} {mean(theirs):+.1f}%"


def figure(cfg, results: Path):
    data = curves(cfg, results)
    models = [m for m in cfg.experiments[EXPERIMENT].models if m in data]
    trained = sorted({K for m in models for K in data[m]})
    colour = {K: style.SEQUENCE[i % len(style.SEQUENCE)] for i, K in enumerate(trained)}
    width = style.COLUMN if len(models) == 1 else style.FULL
    fig, axes = style.subplots(1, len(models), width=width, height=2.6, sharey=True, squeeze=False)
    n_seeds = set()
    for ax, model in zip(axes[0], models):
        for K in sorted(data[model]):
            by_seed = data[model][K]
            n_seeds.add(len(by_seed))
            depths = sorted(set.intersection(*(set(c) for c in by_seed.values())))
            ests = [t_interval([c[k] for c in by_seed.values()]) for k in depths]
            ax.errorbar(depths, [e.mean for e in ests], yerr=[e.bar for e in ests], fmt="o-", ms=3, color=colour[K], label=f"trained K={K}")
            if K in depths:
                e = ests[depths.index(K)]
                ax.plot([K], [e.mean], marker="*", ms=9, color=colour[K], markeredgecolor="black", zorder=5)
        ax.set(title=get_spec(model).label, xlabel="test-time loop depth K'", yscale="log")
        style.integer_axis(ax.xaxis)  # depths are whole iterations
        style.plain_log_axis(ax.yaxis)
        ax.grid(alpha=0.3, lw=0.5)
    axes[0][0].set_ylabel("held-out PPL")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(Line2D([], [], marker="*", ms=9, color="grey", markeredgecolor="black", ls=""))
    labels.append("trained depth")
    axes[0][-1].legend(handles, labels)
    fig.suptitle(f"Test-time depth (this project's study; {style.seeds_text(n_seeds)})")
    return fig


def trained_depths(cfg) -> list[int]:
    """The trained K of the experiment's StateLoop runs (the claim rows' loop counts)."""
    if EXPERIMENT not in cfg.experiments:
        return []
    return sorted({rs[0].K for rs in cells(expand_runs(cfg, [EXPERIMENT])).values() if rs[0].model == "stateloop"})
