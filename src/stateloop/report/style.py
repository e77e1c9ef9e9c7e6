"""The one look of every figure (report/figures.py, report/depth.py), set here and nowhere else.

- Sizes for a two-column paper: a figure is one column (:data:`COLUMN` inches) or the full text
  width (:data:`FULL`) wide, its text at 7-8 pt, laid out by matplotlib's constrained layout so no
  label, legend or caption is cut at the edge (:func:`subplots`).
- Fonts embedded as TrueType (``pdf.fonttype = 42``), never as Type 3, which journals' checks
  refuse and text tools cannot read.
- Colours from Okabe and Ito's palette, which colour-blind readers tell apart, one per model in
  every figure (:func:`model_colour`); the paper's own points in :data:`PAPER` (vermillion) with
  a star, on a twin axis of their own.
- Axis text a reader can read: plain numbers on a narrow log axis, not 1.166x10^2
  (:func:`plain_log_axis`); whole-number ticks where the axis counts something (K, boundaries,
  state indices: :func:`integer_axis`); "one seed, no interval" instead of "95% CI over 1
  seed(s)" (:func:`seeds_text`).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, MaxNLocator  # noqa: E402

COLUMN = 3.3  # inches: one column of a two-column page
FULL = 6.9  # inches: the full text width

RC = {
    "pdf.fonttype": 42,  # TrueType, embedded; no Type 3
    "ps.fonttype": 42,
    "font.size": 7,
    "axes.titlesize": 7.5,
    "axes.labelsize": 7,
    "xtick.labelsize": 6.5,
    "ytick.labelsize": 6.5,
    "legend.fontsize": 6,
    "figure.titlesize": 8,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.1,
    "lines.markersize": 4,
    "errorbar.capsize": 2,
    "savefig.dpi": 300,
}

# Okabe-Ito (plus its grey): black, orange, sky blue, bluish green, yellow, blue, vermillion,
# reddish purple, grey
BLACK, ORANGE, SKY, GREEN, YELLOW, BLUE, VERMILLION, PURPLE, GREY = (
    "#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
PAPER = VERMILLION  # the paper's points and the twin axis they sit on
# One colour per model the figures draw, the same in all of them.
MODEL_COLOURS = {
    "vanilla_looped": BLACK,
    "stateloop": BLUE,
    "state_only": ORANGE,
    "reset_state": SKY,
    "stateloop_gru": GREEN,
    "stateloop_attn": PURPLE,
    "stateloop_mamba2": GREY,
    "vanilla_looped_ffn": YELLOW,
}
# Lines that are not models (trained K, kinds of intervention), in this order; PAPER is left out.
SEQUENCE = (BLUE, ORANGE, GREEN, PURPLE, SKY, BLACK, GREY, YELLOW)
PAPER_STAR = dict(marker="*", s=70, color=PAPER, edgecolors="black", linewidths=0.4, zorder=5)


def model_colour(model: str) -> str:
    """The model's colour in every figure (grey for a model no figure draws today)."""
    return MODEL_COLOURS.get(model, GREY)


def subplots(nrows: int = 1, ncols: int = 1, width: float = FULL, height: float = 2.4, **kwargs):
    """A new figure in the house style: ``width`` is :data:`COLUMN` or :data:`FULL`, the layout
    constrained (labels, legends and the suptitle are fitted inside the canvas)."""
    matplotlib.rcParams.update(RC)
    return plt.subplots(nrows, ncols, figsize=(width, height), layout="constrained", **kwargs)


def plain_log_axis(axis) -> None:
    """Plain numbers (116, 118) on a log axis's major and minor ticks, not 1.16x10^2."""
    for set_formatter in (axis.set_major_formatter, axis.set_minor_formatter):
        set_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def integer_axis(axis) -> None:
    """Ticks at whole numbers only: the axis counts iterations, boundaries or states."""
    axis.set_major_locator(MaxNLocator(integer=True))


def seeds_text(counts) -> str:
    """What an error bar is, from the seed counts of the cells drawn: "one seed, no interval",
    "mean and 95% CI over 3 seeds", "mean and 95% CI over 2/3 seeds"."""
    n = sorted(set(counts))
    if n == [1]:
        return "one seed, no interval"
    text = f"mean and 95% CI over {'/'.join(map(str, n))} seeds"
    return text + " (one seed: no interval)" if 1 in n else text
