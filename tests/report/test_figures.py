"""Every figure as a reader of a paper sees it, rendered from constructed results: its text (ticks,
axis labels, legend entries, titles) read back through matplotlib's objects after a draw, the
PDF's fonts, the sizes of a two-column page and one palette per model."""

import json
import math
from pathlib import Path

import pytest
import yaml

from stateloop.experiments import expand_runs, load_pipeline
from stateloop.report import ladder
from support.reports import constructed_state

ROOT = Path(__file__).parents[2]
TOKENS = [2048 * 50 * i for i in range(1, 6)]
HELD = {"split": "val", "windows": 16, "seq_len": 32, "tokens": 512}


def _ppl(run) -> float:
    """A held-out PPL near 116 (the scale at which Figure 4b's log axis wrote 1.166x10^2)."""
    base = {"vanilla_looped": 118.0, "stateloop": 116.0}.get(run.model, 117.0)
    return base - 0.5 * run.K - 0.02 * run.d_s + 0.3 * run.seed


def _state(run) -> dict:
    return constructed_state(run, tokens=512, read_step=0.01)


def _analyses(run, ppl: float) -> tuple[dict, dict]:
    K = run.K
    share = [100.0 * (0.1 + 0.01 * run.seed) / (K - 1)] * (K - 1)
    share.append(100.0 - sum(share))
    shapley = {"K": K, "reads": [f"R{k}" for k in range(1, K + 1)], "share_pct": share,
               "feedback_share_pct": sum(share[:-1]), "terminal_share_pct": share[-1]}

    def entry(i, extra):
        return {"i": i, "ppl": ppl * (1 + extra * i + 0.001 * run.seed)}

    iv = {"K": K, "unmodified": {"ppl": ppl}, "heldout": {**HELD, "ppl": ppl},
          "replacement": [entry(i, 0.01) for i in range(1, K)], "freezing": [entry(i, 0.04) for i in range(1, K)]}
    return shapley, iv


def constructed(tmp_path: Path, seeds=(1, 2, 3)):
    """The smoke config (every experiment of the paper's figures, plus the test-time depth study)
    at ``seeds``, with every file the figures read written for every run."""
    raw = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    for spec in raw["experiments"].values():
        spec["seeds"] = list(seeds)
    raw["experiments"]["test_time_depth"] = {"scale": "smoke", "models": ["vanilla_looped", "stateloop"], "K": [2, 3],
                                             "d_s": [32], "seeds": list(seeds), "test_time_K": [1, 2, 3, 4, 6]}
    base = raw["scales"]["smoke"]  # a learning-rate bracket: the smoke scale at three peak lrs
    for i, x in enumerate((1e-3, 3e-3, 9e-3), 1):
        raw["scales"][f"smoke_lr{i}"] = {**base, "train": {**base["train"], "lr": x, "min_lr": x / 10}}
        raw["experiments"][f"lr_{i}"] = {"scale": f"smoke_lr{i}", "models": ["vanilla_looped", "stateloop"],
                                         "K": [2, 3], "d_s": [32], "seeds": list(seeds)}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_pipeline(path)
    results = tmp_path / "results"
    for run in expand_runs(cfg):  # the trained runs
        folder = results / "runs" / run.id
        folder.mkdir(parents=True, exist_ok=True)
        ppl = _ppl(run)
        ev = {"heldout": {**HELD, "ppl": ppl}, "tasks": {}}
        if run.model not in ("vanilla_looped", "vanilla_looped_ffn") and run.d_s:
            ev["state"] = _state(run)
        (folder / "eval.json").write_text(json.dumps(ev))
        curve = [{"step": t // 2048, "tokens": t, "loss": math.log(ppl) + 0.5 / (i + 1)} for i, t in enumerate(TOKENS)]
        (folder / "train.json").write_text(json.dumps({"val_curve": curve, "val_windows": {"sha256": "ab" * 32}}))
        shapley, iv = _analyses(run, ppl)
        (folder / "shapley.json").write_text(json.dumps(shapley))
        (folder / "interventions.json").write_text(json.dumps(iv))
        if run.test_time_K:
            depths = [{"K": k, "heldout": {"ppl": ppl * (1 + 0.1 * abs(k - run.K))}} for k in run.test_time_K]
            (folder / "eval_depth.json").write_text(json.dumps({"trained_K": run.K, "depths": depths}))
    return cfg, results


def constructed_ladder(tmp_path: Path, monkeypatch):
    cfg = load_pipeline(ROOT / "configs" / "ladder.yaml")
    log_flops = {"ladder_s": 11.0, "ladder_m": 12.0, "ladder_l": 13.0}
    monkeypatch.setattr(ladder, "training_flops", lambda cfg, run: 10 ** log_flops[run.scale])
    monkeypatch.setattr(ladder, "paper_points", lambda: {4: (7.0e21, -2.31), 7: (2.9e21, -3.21)})
    results = tmp_path / "ladder"
    for run in expand_runs(cfg):
        x = log_flops[run.scale]
        base = 20.0 + 0.5 * run.seed + x
        gap = 3.0 - 2.0 * (x - 12.0) + 0.1 * (run.seed % 3 - 1)
        folder = results / "runs" / run.id
        folder.mkdir(parents=True)
        ppl = base * (1 + gap / 100) if run.model == "stateloop" else base
        (folder / "eval.json").write_text(json.dumps({"heldout": {"ppl": ppl}, "tasks": {}}))
    return cfg, results


@pytest.fixture(scope="module")
def render(tmp_path_factory):
    """render(name, seeds): the figure drawn from constructed results, once per module (the
    tests only read it); the ladder's FLOP count and the paper's points stubbed while it draws."""
    from stateloop.report.figures import FIGURES

    drawn = {}

    def draw(name, seeds=(1, 2, 3)):
        key = (name, tuple(seeds))
        if key not in drawn:
            tmp = tmp_path_factory.mktemp(f"{name}{len(seeds)}")
            with pytest.MonkeyPatch.context() as mp:
                cfg, results = constructed_ladder(tmp, mp) if name == "gap_vs_compute" else constructed(tmp, seeds)
                fig = FIGURES[name](cfg, results)
                fig.canvas.draw()
            drawn[key] = fig
        return drawn[key]

    yield draw
    for fig in drawn.values():
        _close(fig)


def _tick_labels(axis, minor: bool = False):
    """The tick labels drawn (inside the view, on either side): matplotlib keeps labels of ticks
    beyond the limits that it does not draw."""
    lo, hi = sorted(axis.get_view_interval())
    eps = 1e-9 * (hi - lo)
    ticks, locs = (axis.get_minor_ticks(), axis.get_minorticklocs()) if minor else (axis.get_major_ticks(), axis.get_majorticklocs())
    return [label for tick, loc in zip(ticks, locs) if lo - eps <= loc <= hi + eps
            for label in (tick.label1, tick.label2) if label.get_visible() and label.get_text()]


def _texts(fig):
    """Every piece of text a reader sees: titles, axis labels, tick labels, legends, annotations."""
    out = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        out += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            out += _tick_labels(axis) + _tick_labels(axis, minor=True)
        if ax.get_legend() is not None:
            out += ax.get_legend().get_texts()
    for legend in fig.legends:
        out += legend.get_texts()
    return [t for t in out if t.get_visible() and t.get_text()]


def _legends(fig):
    return [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


FIGURE_NAMES = ["loop_depth", "state_width", "state_analysis", "gap_vs_tokens", "state_diagnostics", "gap_vs_compute",
                "test_time_depth", "lr_sweep"]


def test_every_figure_is_drawn_here():
    from stateloop.report.figures import FIGURES

    assert sorted(FIGURES) == sorted(FIGURE_NAMES)


@pytest.mark.parametrize("name", FIGURE_NAMES)
@pytest.mark.slow
def test_a_figure_fits_a_two_column_page_with_truetype_fonts_and_nothing_cut_at_the_edge(render, name):
    """One column (3.3 in) or the full width (6.9 in); the PDF embeds its fonts as TrueType, no
    Type 3; every title, label, tick label and legend entry lies inside the canvas (constrained
    layout: Figure 4a's caption below the axis was cut at the left edge). Each problem is
    reported, not only the first."""
    import io

    from stateloop.report import style

    fig = render(name)
    problems = []
    if fig.get_figwidth() not in (style.COLUMN, style.FULL) or fig.get_figheight() > 9.0:
        problems.append(f"size {fig.get_size_inches()} in")
    canvas = fig.get_window_extent()
    renderer = fig.canvas.get_renderer()
    for text in _texts(fig):
        box = text.get_window_extent(renderer)
        if box.x0 < canvas.x0 - 1 or box.x1 > canvas.x1 + 1 or box.y0 < canvas.y0 - 1 or box.y1 > canvas.y1 + 1:
            problems.append(f"cut at the edge: {text.get_text()!r}")
    buf = io.BytesIO()
    fig.savefig(buf, format="pdf")
    pdf = buf.getvalue()
    if b"/Type3" in pdf or b"/FontFile2" not in pdf:  # FontFile2: an embedded TrueType program
        problems.append("fonts not embedded as TrueType")
    assert not problems, problems


@pytest.mark.parametrize("seeds, says", [((1,), "one seed, no interval"), ((1, 2, 3), "mean and 95% CI over 3 seeds")])
@pytest.mark.slow
def test_titles_say_what_the_error_bars_are(render, seeds, says):
    """With one seed there is no interval, and the titles say so; "seed(s)" appears nowhere."""
    for name in FIGURE_NAMES:
        if name == "gap_vs_compute":  # the ladder config's own six seeds
            continue
        fig = render(name, seeds)
        text = " ".join(t.get_text() for t in _texts(fig))
        assert says in text and "seed(s)" not in text, (name, text)
        assert "95% CI over 1 " not in text
    fig = render("gap_vs_compute")
    labels = [t.get_text() for legend in _legends(fig) for t in legend.get_texts()]
    assert "ours, K=4 (mean and 95% CI over 6 seeds)" in labels


def test_figure_4b_ticks_are_plain_numbers_at_whole_boundaries(render):
    """PPL near 116 on a log axis: the ticks read 116, 118, not 1.166x10^2; boundaries are whole."""
    fig = render("state_analysis")
    ours, twin = fig.axes[1], fig.axes[2]
    assert ours.get_xlabel() == "boundary i" and ours.get_yscale() == "log" and twin.get_yscale() == "log"
    for ax in (ours, twin):
        labels = [t.get_text() for t in _tick_labels(ax.yaxis) + _tick_labels(ax.yaxis, minor=True)]
        assert labels, ax
        for label in labels:
            float(label.replace("\N{MINUS SIGN}", "-"))  # a plain number, no mathtext, no x10^
    ours_labels = [float(t.get_text()) for t in _tick_labels(ours.yaxis) + _tick_labels(ours.yaxis, minor=True)]
    assert any(110 <= v <= 130 for v in ours_labels), ours_labels
    xs = [t.get_text() for t in _tick_labels(ours.xaxis)]
    assert xs and all(x.isdigit() for x in xs), xs  # 1, 2, 3, never 1.25


@pytest.mark.parametrize("seeds", [(1,), (1, 2, 3)])
def test_figure_3_point_labels_stay_inside_the_axes_clear_of_the_title(render, seeds):
    """Paper, Figure 3 labels its points with d_s and PPL; a label must not run over the title,
    the axes' edge or the next label."""
    fig = render("state_width", seeds)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    title = ax.title.get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert [t.get_text().split("\n")[0] for t in ax.texts] == ["d_s=16", "d_s=32"]
    for box in boxes:
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, (box, inside)
        assert not box.overlaps(title)
    assert not boxes[0].overlaps(boxes[1])


def _entries(legend):
    """(text, the artists drawn as its mark) of each legend entry, as the legend laid them out."""
    for column in legend._legend_handle_box.get_children():
        for row in column.get_children():
            box, text = row.get_children()
            yield text.get_children()[0].get_text(), box.get_children()


def _visible(artist) -> bool:
    """Whether an artist of a legend mark shows ink a reader sees: a line, a marker, a patch or
    points of a readable size, in a colour other than the page's."""
    from matplotlib.collections import LineCollection, PathCollection
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def inked(colours) -> bool:
        return any(c[3] > 0 and min(c[:3]) < 0.9 for c in (to_rgba(x) for x in colours))

    if not artist.get_visible():
        return False
    if isinstance(artist, Line2D):
        line = artist.get_linestyle() not in ("None", "", " ") and artist.get_linewidth() > 0
        mark = artist.get_marker() not in (None, "None", "", " ") and artist.get_markersize() >= 3
        return (line and inked([artist.get_color()])) or (mark and inked([artist.get_markerfacecolor(), artist.get_markeredgecolor()]))
    if isinstance(artist, PathCollection):
        return len(artist.get_sizes()) > 0 and min(artist.get_sizes()) >= 20 and \
            inked(list(artist.get_facecolors()) + list(artist.get_edgecolors()))
    if isinstance(artist, LineCollection):
        return min(artist.get_linewidths()) > 0 and inked(artist.get_colors())
    if isinstance(artist, Patch):
        return inked([artist.get_facecolor()])
    raise AssertionError(f"an unexpected legend mark: {artist!r}")


@pytest.mark.parametrize("name", FIGURE_NAMES)
def test_every_legend_entry_has_a_visible_mark(render, name):
    fig = render(name)
    legends = _legends(fig)
    assert legends
    for legend in legends:
        for text, marks in _entries(legend):
            assert any(_visible(m) for m in marks), (name, text)


def test_the_legend_check_sees_an_invisible_mark():
    """The check above flags an entry drawn with neither line nor marker, or in the page's white."""
    from stateloop.report import style

    fig, ax = style.subplots(width=style.COLUMN)
    ax.plot([0, 1], [0, 1], ls="", marker="", label="nothing")
    ax.plot([0, 1], [0, 1], ls="", marker="o", color="white", label="white")
    ax.errorbar([0, 1], [0, 1], yerr=[0.1, 0.1], fmt="o-", label="seen")
    fig.canvas.draw()
    seen = {text: any(_visible(m) for m in marks) for text, marks in _entries(ax.legend())}
    assert seen == {"nothing": False, "white": False, "seen": True}
    _close(fig)


def test_one_colour_blind_safe_colour_per_model_in_every_figure(render):
    """StateLoop and Vanilla Looped look the same in Figures 2, 3 and S2, in Okabe-Ito colours."""
    from matplotlib.colors import to_hex

    from stateloop.report import style

    okabe_ito = {style.BLACK, style.ORANGE, style.SKY, style.GREEN, style.YELLOW, style.BLUE, style.VERMILLION,
                 style.PURPLE, style.GREY}
    seen: dict[str, set] = {}
    for name in ("loop_depth", "state_width", "state_diagnostics"):
        fig = render(name)
        for ax in fig.axes:
            for bar in ax.containers:
                model = bar.get_label().split(" ")[0]
                if hasattr(bar, "lines") and model in style.MODEL_COLOURS:
                    seen.setdefault(model, set()).add(to_hex(bar.lines[0].get_color()).upper())
    assert seen["stateloop"] == {style.model_colour("stateloop")} and seen["vanilla_looped"] == {style.BLACK}
    assert len(seen) >= 5 and all(c <= okabe_ito for c in seen.values()), seen
    assert len({next(iter(c)) for c in seen.values()}) == len(seen)  # no two models share one
