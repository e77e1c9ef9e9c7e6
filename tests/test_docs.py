"""The documentation as an index: "README.md at most about 150 lines ... Results (the
verdict tables, measured times) go to `docs/results.md`, generated or checked against the latest
outputs so it cannot drift ... choices the paper leaves open to `docs/choices.md` (one table,
linked from the code's `[choice]` marks) ... No fact is written in two of these."

docs/results.md's tables are rendered from docs/tables/*.csv by scripts/results_doc.py (standard
library only, so it is loaded here from its file)."""

import csv
import importlib.util
import inspect
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _results_doc():
    spec = importlib.util.spec_from_file_location("results_doc", ROOT / "scripts" / "results_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_an_index():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail to docs/"
    text = "\n".join(lines)
    assert "bash scripts/run.sh" in text and "bash scripts/test.sh" in text
    for page in ["docs/results.md", "docs/usage.md", "docs/cluster.md", "docs/choices.md", "docs/architecture.md",
                 "configs/README.md", "benchmarks/README.md"]:
        assert f"]({page})" in text, f"README.md does not link {page}"


def test_the_readme_lists_every_command_and_config():
    """The commands table names every `stateloop` command `--help` lists, the scales table every config."""
    from stateloop.commands import PIPELINE, TOOLS

    text = (ROOT / "README.md").read_text()
    for command in [*PIPELINE, *TOOLS]:
        assert f"| `stateloop {command}" in text, f"README.md's commands table lacks stateloop {command}"
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        assert f"| `configs/{config.name}`" in text, f"README.md's scales table lacks configs/{config.name}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_at_an_existing_file_and_heading(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    checked = 0
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(ROOT)}: link {target} names no file"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{page.relative_to(ROOT)}: link {target}: no such heading"
        checked += 1
    assert checked or page.name == "ecosystem.md"


SOURCES = "## Sources of the training recipe"


def _choice_rows() -> list[str]:
    lines = (DOCS / "choices.md").read_text().split(SOURCES)[0].splitlines()
    return [line for line in lines if line.startswith("| ") and not line.startswith("| choice |")]


def test_choices_is_one_table_naming_files_that_exist():
    """One index of the choices, each row with its source ("ours" or where the value comes from)
    and the files that hold it; then the training recipe's sources."""
    text = (DOCS / "choices.md").read_text()
    index = text.split(SOURCES)[0]
    assert len(re.findall(r"^\|(?:---\|)+$", index, flags=re.M)) == 1, "docs/choices.md holds one index table"
    assert "| choice | ours | source | where |" in index
    rows = _choice_rows()
    assert len(rows) >= 30
    for row in rows:
        cells = row.strip(" |").split(" | ")
        assert len(cells) == 4 and cells[2].strip(), f"docs/choices.md: a row without its source: {row[:60]}"
        where = row.rstrip(" |").rsplit(" | ", 1)[1]
        files = [t.split("#")[0] for t in LINK.findall(where) if t.startswith("../")]
        assert files, f"docs/choices.md: a row names no file: {row[:60]}"
        for f in files:
            assert (DOCS / f).is_file(), f"docs/choices.md names {f}, which does not exist"


def test_the_training_recipe_names_a_source_for_every_setting():
    """The issue: "docs/choices.md names a source for every assumption" of the recipe, beside the
    paper's value and the authors' (LUMIA-Group/PonderLM-2), saying why where paper.yaml keeps
    another. Every row has five cells; the source names the paper, the authors, both or ours."""
    text = (DOCS / "choices.md").read_text()
    assert SOURCES in text
    rows = [ln for ln in text.split(SOURCES)[1].splitlines() if ln.startswith("| ") and not ln.startswith("| setting |")]
    assert len(rows) >= 15
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 5, row[:80]
        assert re.match(r"(the paper|the authors|the first release|both|ours)", cells[4]), row[:80]
    settings = {row.split(" | ")[0][2:] for row in rows}
    for needed in ("backbone init", "init std", "warm-up", "weight decay", "RMSNorm epsilon", "RoPE base", "AdamW",
                   "vocabulary rows", "embeddings", "schedule"):
        assert needed in settings, needed


def test_every_file_with_a_choice_mark_has_a_row_in_choices():
    """A `[choice]` or `[assume]` mark in the code or a config is indexed by docs/choices.md (the
    generated configs/README.md and JSON Schema repeat the dataclasses' marks and are left out)."""
    linked = {(DOCS / t.split("#")[0]).resolve() for t in LINK.findall((DOCS / "choices.md").read_text())}
    generated = {ROOT / "configs/README.md", *(ROOT / "workflow/schemas").glob("*")}
    marked = [p for folder in ("src", "configs", "workflow") for p in sorted((ROOT / folder).rglob("*"))
              if p.is_file() and p.suffix in {".py", ".yaml", ".smk"} and p not in generated
              and re.search(r"\[(choice|assume)\]", p.read_text())]
    assert len(marked) >= 15
    missing = [str(p.relative_to(ROOT)) for p in marked if p.resolve() not in linked]
    assert not missing, f"marked [choice]/[assume] but not in docs/choices.md: {missing}"


def _paragraphs(page: Path) -> list[str]:
    """Prose paragraphs of 80 characters or more, whitespace normalised (no code, tables, headings)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    out = []
    for block in re.split(r"\n\s*\n", text):
        if block.lstrip().startswith(("|", "#", "<!--", "![")):
            continue
        para = " ".join(block.split())
        if len(para) >= 80:
            out.append(para)
    return out


def test_no_paragraph_is_written_in_two_pages():
    seen: dict[str, str] = {}
    for page in PAGES:
        for para in _paragraphs(page):
            assert para not in seen or seen[para] == page.name, \
                f"written in {seen[para]} and {page.name}: {para[:80]}..."
            seen[para] = page.name
    assert len(seen) > 100


def test_results_page_tables_are_rendered_from_the_data_files():
    doc = _results_doc()
    text = (DOCS / "results.md").read_text()
    assert doc.render_page(text, DOCS) == text, "run: python scripts/results_doc.py"
    assert doc.main(["--check"]) == 0
    markers = [m.group(1) for line in text.splitlines() if (m := doc.MARKER.match(line))]
    files = sorted(f"tables/{p.name}" for p in (DOCS / "tables").glob("*.csv"))
    assert sorted(markers) == files, "every data file in docs/tables/ has one table in docs/results.md"


def test_a_changed_number_in_a_data_file_changes_the_page(tmp_path):
    doc = _results_doc()
    shutil.copytree(DOCS / "tables", tmp_path / "tables")
    text = (DOCS / "results.md").read_text()
    lr = tmp_path / "tables" / "lr_bracket.csv"
    lr.write_text(lr.read_text().replace("+0.80 [-0.69, +2.28]", "+0.81 [-0.69, +2.28]"))
    claims = tmp_path / "tables" / "decide.claims.csv"
    claims.write_text(claims.read_text().replace(",4.27,2.94,", ",4.26,2.94,"))
    rendered = doc.render_page(text, tmp_path)
    changed = [(a, b) for a, b in zip(text.splitlines(), rendered.splitlines()) if a != b]
    assert [b for _, b in changed] == [
        "| StateLoop lowers perplexity against Vanilla Looped (Table 1) | -2.31 | +4.26 [+2.94, +5.61] | 1.34 | 8 | **contradicted** |",
        "| 4 | 9e-3 | 6 | 53.6 | 54.1 | +0.81 [-0.69, +2.28] |"]


def _claims_csv_columns() -> list[str]:
    """The columns stateloop.report.claims.judge writes to results/claims.csv, read from its code."""
    from stateloop.report import claims

    source = inspect.getsource(claims.judge)
    return re.findall(r'"(\w+)": ', source) + list(dict.fromkeys(re.findall(r"(\w+)=", source.split("row.update(")[1])))


def test_import_takes_a_runs_claims_csv(tmp_path):
    """`results_doc.py import` keeps the paper's claims that ran, as results/claims.md prints them."""
    doc = _results_doc()
    columns = _claims_csv_columns()
    assert set(doc.CLAIM_COLUMNS) <= set(columns), set(doc.CLAIM_COLUMNS) - set(columns)
    base = dict.fromkeys(columns, "")
    rows = [
        {**base, "id": "stateloop_vs_vanilla", "claim": "StateLoop lowers perplexity against Vanilla Looped",
         "source": "Table 1", "paper_effect": "-2.3103", "paper_unit": "% PPL change", "unit": "% PPL change",
         "ours": "4.2720", "ci_lo": "2.9360", "ci_hi": "5.6080", "ci_half_width": "1.3360", "n": "8",
         "method": "paired t", "verdict": "contradicted", "note": "decide/stateloop/K4_ds64 vs ..."},
        {**base, "id": "gru_worse", "claim": "A GRU update is worse than StateLoop's selective update",
         "source": "Table 4", "paper_effect": "0.55", "unit": "% PPL change", "n": "0", "verdict": "not run"},
        {**base, "id": "trend", "claim": "The PPL gap shrinks", "source": "own: training tokens (not the paper's)",
         "paper_effect": "", "unit": "points", "ours": "1", "n": "3", "verdict": "grows"},
        {**base, "id": "read_init_input_vs_residual_K3", "claim": "Input-style read init", "source": "choice: model.read_init",
         "paper_effect": "", "unit": "% PPL change", "ours": "3.9", "n": "4", "verdict": "-"},
    ]
    claims_csv = tmp_path / "claims.csv"
    with claims_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "decide.claims.csv"
    assert doc.main(["import", str(claims_csv), str(out)]) == 0
    assert doc.render_table(out)[2:] == [
        "| StateLoop lowers perplexity against Vanilla Looped (Table 1) | -2.31 | +4.27 [+2.94, +5.61] | 1.34 | 8 | **contradicted** |"]
    with pytest.raises(SystemExit):
        doc.main(["import", str(claims_csv), str(tmp_path / "decide.csv")])  # not a *.claims.csv name
