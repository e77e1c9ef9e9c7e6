"""The tables of docs/results.md and the other pages in docs/ (docs/cluster.md's plan), rendered
from the data files in docs/tables/, so that a number is written once and the page cannot drift
from it (tests/test_docs.py checks). Standard library only.

    python scripts/results_doc.py                 # rewrite the tables of every page in docs/
    python scripts/results_doc.py --check         # exit 1, naming the first table that differs
    python scripts/results_doc.py import results/claims.csv docs/tables/NAME.claims.csv

In a page a table follows a marker line ``<!-- table: tables/NAME.csv -->`` (the path is relative
to docs/); every line from the marker to the next blank line is rewritten from the file. The
``plan_<config>*.csv`` files are the plan's own figures (``stateloop plan --config configs/<config>.yaml
--analyses --doc-tables docs/tables``; tests/test_docs.py compares them with a fresh plan).
Two kinds of data file:

- ``*.claims.csv``: verdict rows, the columns CLAIM_COLUMNS of a run's ``results/claims.csv``
  (``stateloop.report.claims.judge``). ``import`` copies them from a claims.csv, keeping the
  paper's claims that ran (not the "own" or "choice" rows, not "not run"). Numbers print as
  ``results/claims.md`` prints them: signed, two decimals.
- any other ``*.csv``: the table as printed, one cell per field; a header ending in ":" is a
  right-aligned column (the ":" is not printed).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))  # every page in docs/: those with markers have tables
MARKER = re.compile(r"^<!-- table: (\S+) -->$")
CLAIM_COLUMNS = ["claim", "source", "unit", "paper_effect", "paper_unit", "ours", "ci_lo", "ci_hi",
                 "ci_half_width", "n", "verdict"]
PCT = "% PPL change"  # the unit a claim's row does not repeat (stateloop.report.claims.PCT)
SKIPPED_SOURCES = ("own", "choice")
NOT_RUN = "not run"


def _float(text: str) -> float:
    return float(text) if text.strip() not in ("", "nan", "NaN") else math.nan


def _num(text: str) -> str:
    v = _float(text)
    return "-" if math.isnan(v) else f"{v:+.2f}"


def claim_row(r: dict) -> list[str]:
    """One verdict row: claim (source) (unit unless % PPL), paper, ours [95% CI], resolves, seeds, verdict."""
    unit = "" if r["unit"] == PCT else f" ({r['unit']})"
    paper = r["paper_unit"] if math.isnan(_float(r["paper_effect"])) else _num(r["paper_effect"])
    ours = _num(r["ours"]) + ("" if math.isnan(_float(r["ci_lo"])) else f" [{_num(r['ci_lo'])}, {_num(r['ci_hi'])}]")
    half = _float(r["ci_half_width"])
    return [f"{r['claim']} ({r['source']}){unit}", paper, ours, "-" if math.isnan(half) else f"{half:.2f}",
            str(int(_float(r["n"]))), f"**{r['verdict']}**"]


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    names = [h[:-1] if h.endswith(":") else h for h in header]
    rule = ["---:" if h.endswith(":") else "---" for h in header]
    return ["| " + " | ".join(names) + " |", "|" + "|".join(rule) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def render_table(path: Path) -> list[str]:
    """The Markdown lines of one data file."""
    with path.open(newline="") as f:
        if path.name.endswith(".claims.csv"):
            rows = list(csv.DictReader(f))
            header = ["claim", "paper", "ours [95% CI]", "resolves", "seeds", "verdict"]
            return _markdown(header, [claim_row(r) for r in rows])
        header, *rows = list(csv.reader(f))
    return _markdown(header, rows)


def render_page(text: str, base: Path) -> str:
    """``text`` with the table after each marker rendered from its file (paths relative to ``base``)."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        out.append(lines[i])
        found = MARKER.match(lines[i])
        i += 1
        if found:
            path = base / found.group(1)
            if not path.is_file():
                raise SystemExit(f"table file {found.group(1)} (relative to {base}) does not exist")
            out += render_table(path)
            while i < len(lines) and lines[i].strip():
                i += 1
    return "\n".join(out)


def import_claims(claims_csv: Path, out: Path) -> int:
    """The paper's claims that ran, from a run's results/claims.csv, as a ``*.claims.csv`` data file."""
    with claims_csv.open(newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if not r["source"].startswith(SKIPPED_SOURCES) and r["verdict"] != NOT_RUN]
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, CLAIM_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's tables differ from the files")
    sub = parser.add_subparsers(dest="command")
    imp = sub.add_parser("import", help="a run's results/claims.csv -> docs/tables/NAME.claims.csv")
    imp.add_argument("claims_csv", type=Path)
    imp.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "import":
        if not args.out.name.endswith(".claims.csv"):
            parser.error(f"{args.out}: the data file's name must end in .claims.csv")
        print(f"{import_claims(args.claims_csv, args.out)} rows -> {args.out}")
        return 0
    for page in PAGES:
        text = page.read_text()
        rendered = render_page(text, page.parent)
        if rendered == text:
            continue
        if args.check:
            first = next(a for a, b in zip_longest(text.split("\n"), rendered.split("\n"), fillvalue="") if a != b)
            print(f"{page.relative_to(ROOT)} differs from its data files at: {first!r}; run python scripts/results_doc.py",
                  file=sys.stderr)
            return 1
        page.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
