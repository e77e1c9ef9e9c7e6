"""One table of outputs (stateloop.report.outputs): each has its renderer, and the CLI offers
exactly these names (output names spelled once)."""

from stateloop.commands import build_parser
from stateloop.report import figures, tables
from stateloop.report.outputs import COMPARE, OUTPUTS, of_kind


def test_every_output_has_its_renderer_and_files():
    assert set(of_kind("table")) == set(tables.TABLES)
    assert set(of_kind("figure")) == set(figures.FIGURES)
    assert of_kind("claims") == ["claims"]
    for o in OUTPUTS.values():
        first, twin = o.files
        assert first.endswith(".pdf" if o.kind == "figure" else ".csv") and twin.rsplit(".", 1)[0] == first.rsplit(".", 1)[0]
        assert o.label.split()[0] in ("Table", "Figure", "The")


def test_render_offers_exactly_the_outputs():
    parser = build_parser()
    render = next(a for a in parser._actions if a.dest == "command").choices["render"]
    target = next(a for a in render._actions if a.dest == "target")
    assert list(target.choices) == [*OUTPUTS, COMPARE]  # and an experiment's own comparison (--experiment)
