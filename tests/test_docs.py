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
    recipe = text.split(SOURCES)[1].split("\n## ")[0]  # the section, up to the next one
    rows = [ln for ln in recipe.splitlines() if ln.startswith("| ") and not ln.startswith("| setting |")]
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


def test_the_pages_tables_are_rendered_from_the_data_files():
    doc = _results_doc()
    assert DOCS / "results.md" in doc.PAGES and DOCS / "cluster.md" in doc.PAGES
    markers = []
    for page in doc.PAGES:
        text = page.read_text()
        assert doc.render_page(text, DOCS) == text, f"{page.name}: run python scripts/results_doc.py"
        markers += [m.group(1) for line in text.splitlines() if (m := doc.MARKER.match(line))]
    assert doc.main(["--check"]) == 0
    files = sorted(f"tables/{p.name}" for p in (DOCS / "tables").glob("*.csv"))
    assert sorted(markers) == files, "every data file in docs/tables/ has one table in one page of docs/"


# The plan's figures: docs/tables/plan_<config>[_<table>].csv, written by `stateloop plan --config
# configs/<config>.yaml --doc-tables docs/tables` (ops/cost.py doc_tables).
PLAN_TABLE = re.compile(r"^plan_(.+?)(_inputs|_experiments|_settings|_analyses)?\.csv$")


@pytest.mark.slow  # plans paper.yaml (with its analyses) and ladder_gpu.yaml afresh: about a minute on 2 loaded cores
def test_the_plan_figures_in_the_docs_are_the_plans_own(monkeypatch):
    """Every plan figure the pages print (GPU-hours, per-run rows, memory, the alternatives, the
    analyses' hours, the MFU's record) is what `stateloop plan` prints now: a change to the code, a
    config or the GPU records that moves one fails here until the tables are written again."""
    from stateloop.commands.plan import plan_mfu
    from stateloop.experiments import load_pipeline
    from stateloop.ops import cost
    from stateloop.ops.analysis_cost import analysis_plan_rows
    from stateloop.ops.mfu import RECORDS_ENV

    monkeypatch.delenv(RECORDS_ENV, raising=False)  # the repository's records, as the pages say
    files = {p.name: p for p in (DOCS / "tables").glob("plan_*.csv")}
    stems = {PLAN_TABLE.match(name).group(1) for name in files}
    assert stems == {"paper", "ladder_gpu"} and "plan_paper.csv" in files
    for stem in sorted(stems):
        cfg = load_pipeline(ROOT / "configs" / f"{stem}.yaml")
        mfu = plan_mfu(cfg)
        analyses = analysis_plan_rows(cfg, mfu, data_root=ROOT / "data") if f"plan_{stem}_analyses.csv" in files else None
        tables = cost.doc_tables(stem, cost.plan_rows(cfg, None, mfu), mfu, cost.DEFAULT_PEAK_TFLOPS, analyses=analyses)
        mine = sorted(name for name in files if PLAN_TABLE.match(name).group(1) == stem)
        assert set(mine) <= set(tables), set(mine) - set(tables)
        for name in mine:
            with files[name].open(newline="") as f:
                written = list(csv.reader(f))
            assert written == tables[name], (
                f"docs/tables/{name} is not what the plan prints now: stateloop plan --config configs/{stem}.yaml"
                f"{' --analyses' if analyses else ''} --doc-tables docs/tables; python scripts/results_doc.py")


def test_the_doc_tables_are_the_plans_rows(tmp_path, capsys):
    """`stateloop plan --doc-tables` writes the rows the plan prints, as the pages print them, and then
    rewrites only the tables the folder has."""
    from stateloop.cli import main

    config = ROOT / "configs" / "tiny.yaml"
    out = tmp_path / "rows.csv"
    assert main(["plan", "--config", str(config), "--experiments", "table1", "--mfu", "0.25", "--out", str(out),
                 "--doc-tables", str(tmp_path)]) == 0
    capsys.readouterr()
    rows = list(csv.DictReader(out.open()))
    with (tmp_path / "plan_tiny.csv").open(newline="") as f:
        header, *runs = list(csv.reader(f))
    assert header[0] == "run" and header[-1] == "GPU-h:"
    assert [r[0] for r in runs[:-1]] == [r["run"] for r in rows] and runs[-1][0] == f"all {len(rows)} runs"
    assert [r[3] for r in runs[:-1]] == [f"{float(r['mem_gib']):.1f}" for r in rows]
    total = sum(float(r["gpu_hours"]) for r in rows)
    assert runs[-1][-1] == (f"{total:,.0f}" if total >= 100 else f"{total:.1f}")
    with (tmp_path / "plan_tiny_inputs.csv").open(newline="") as f:
        assert ["MFU", "MFU 0.25 for every run (--mfu)"] in list(csv.reader(f))
    (tmp_path / "plan_tiny_inputs.csv").unlink()
    before = (tmp_path / "plan_tiny.csv").read_text()
    (tmp_path / "plan_tiny.csv").write_text("a stale table\n")
    assert main(["plan", "--config", str(config), "--experiments", "table1", "--mfu", "0.25", "--doc-tables", str(tmp_path)]) == 0
    assert f"wrote {tmp_path / 'plan_tiny.csv'}" in capsys.readouterr().out
    assert (tmp_path / "plan_tiny.csv").read_text() == before  # rewritten, as it was
    assert not (tmp_path / "plan_tiny_inputs.csv").exists()  # only the tables the folder has


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
