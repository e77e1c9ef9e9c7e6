"""Tables 1-4: our numbers from the run folders, the paper's beside them, and the difference.

Every table is a pandas DataFrame with, for each reported quantity ``q``, the columns ``q``
(ours), ``q_paper`` and ``q_diff`` (ours - paper). The CSV holds all three; the Markdown twin
prints ``ours (paper, +diff)`` per cell and the metric notes underneath. A run that a table needs
but that has no result yet is an error naming the missing file, never a blank cell.

Which experiment of the config feeds which table (ARCHITECTURE.md):
table1/table2 <- ``table1``; table3 <- ``decoding`` (the decode benchmark's JSON);
table4 <- ``table4``.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import pandas as pd

from stateloop.evaluate import metrics as M
from stateloop.evaluate.config import PAPER_TASKS as EVAL_TASKS

TABLE4_GROUPS = [  # (ablation, variant) rows as the paper prints them
    ("feedback", "state_only"), ("feedback", "stateloop"),
    ("persistence", "reset_state"), ("persistence", "stateloop"),
    ("update_rule", "vanilla_looped"), ("update_rule", "stateloop_gru"), ("update_rule", "stateloop"),
]
PAPER_TASKS = [t for t in EVAL_TASKS if t in M.ACCURACY_METRIC]  # Table 2's eight accuracy tasks


def reference(name: str) -> pd.DataFrame:
    """The paper's numbers: ``table1_ppl``, ``table2_accuracy``, ``table3_decoding``,
    ``table4_ablations``, ``figures_text``."""
    with resources.files("stateloop.report").joinpath(f"reference/{name}.csv").open() as fh:
        return pd.read_csv(fh)


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (the stage that writes it has not run for this run)")
    with open(path) as fh:
        return json.load(fh)


def _runs(cfg, experiment: str):
    from stateloop.experiments import expand_runs

    if experiment not in cfg.experiments:
        raise KeyError(f"experiments.{experiment}: the config defines no such experiment (needed by this table)")
    return expand_runs(cfg, [experiment])


def _params(run) -> int:
    from stateloop.models.registry import count_params

    return count_params(run.model_config)


def heldout_description(cfg, runs) -> str:
    """Which data the held-out perplexity of these runs is measured on, in words (one scale)."""
    scales = sorted({run.scale for run in runs})
    parts = []
    for scale in scales:
        sc = cfg.scales[scale]
        split = sc.eval.heldout_split
        source = sc.data.source if isinstance(sc.data.source, str) else ", ".join(sc.data.source)
        if split == "val":
            where = sc.data.val_description
        else:
            where = f"its {split!r} split"
        parts.append(f"the {split!r} split of {source} ({where})" + (f" at scale {scale}" if len(scales) > 1 else ""))
    return "; ".join(parts)


def _side_by_side(ours: pd.DataFrame, paper: pd.DataFrame, keys: list[str], quantities: list[str]) -> pd.DataFrame:
    """Join ours and the paper's on ``keys``; add q_paper and q_diff after each quantity q."""
    paper = paper[[c for c in paper.columns if c in keys or c in quantities]]
    paper = paper.rename(columns={q: f"{q}_paper" for q in quantities})  # also where ours lacks q
    df = ours.merge(paper, on=keys, how="left")
    cols = list(keys)
    for q in quantities:
        if q not in df:
            df[q] = math.nan
        if f"{q}_paper" not in df:
            df[f"{q}_paper"] = math.nan
        df[f"{q}_diff"] = df[q] - df[f"{q}_paper"]
        cols += [q, f"{q}_paper", f"{q}_diff"]
    extra = [c for c in ours.columns if c not in cols]
    return df[cols + extra]


# ----------------------------------------------------------------------------------------------


def table1(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Perplexities: held-out (the paper's Pile column), LAMBADA-OpenAI (token), WikiText-2 (word)."""
    from stateloop.models.flops import compute_profile

    runs = _runs(cfg, "table1")
    rows, exact = [], {}
    for run in runs:
        ev = read_json(results / "runs" / run.id / "eval.json")
        exact[run.model] = _params(run)
        prof = compute_profile(run.model_config, cfg.scales[run.scale].train.seq_len)
        row = {"model": run.model, "run": run.id, "params_m": round(exact[run.model] / 1e6, 2),
               "pile_ppl": ev["heldout"]["ppl"], "layer_apps_per_token": round(prof.layer_applications_per_token, 2),
               "train_flops_per_token": prof.flops_per_token}
        for task, entry in ev.get("tasks", {}).items():
            metric = entry.get("reported", {}).get("perplexity")
            block = entry["shots"].get("0")
            if metric and block and metric in block["metrics"]:
                col = {"lambada_openai": "lambada_openai_ppl", "wikitext": "wikitext2_word_ppl"}.get(entry["column"], f"{entry['column']}_ppl")
                row[col] = block["metrics"][metric]
        rows.append(row)
    ours = pd.DataFrame(rows)
    base = exact.get("vanilla_looped")  # exact counts: the rounded ones are off by up to 2 points at small scales
    ours["params_vs_vanilla_pct"] = [100 * (exact[m] / base - 1) if base else math.nan for m in ours.model]
    base_flops = ours.loc[ours.model == "vanilla_looped", "train_flops_per_token"]
    ours["flops_vs_vanilla_pct"] = (100 * (ours.train_flops_per_token / base_flops.iloc[0] - 1)
                                    if len(base_flops) else math.nan)
    ours = ours.drop(columns="train_flops_per_token")
    quantities = ["params_m", "params_vs_vanilla_pct", "pile_ppl", "lambada_openai_ppl", "wikitext2_word_ppl"]
    quantities += sorted(c for c in ours.columns if c.endswith("_ppl") and c not in quantities)
    notes = [f"pile_ppl: token perplexity on {heldout_description(cfg, runs)}.",
             "layer_apps_per_token: decoder-layer applications per token (loop iterations unrolled); "
             "flops_vs_vanilla_pct: training matmul FLOPs per token against Vanilla Looped, both counted "
             "from the real forward and backward pass at the training length (models/flops.py).",
             M.describe("perplexity")]
    return _side_by_side(ours, reference("table1_ppl"), ["model"], quantities), notes


def table2(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Accuracy (%) on the evaluation tasks at 0 and 5 shots, and their average."""
    runs = _runs(cfg, "table1")
    rows = []
    for run in runs:
        ev = read_json(results / "runs" / run.id / "eval.json")
        by_shots: dict[str, dict] = {}
        for task, entry in ev.get("tasks", {}).items():
            metric = entry.get("reported", {}).get("accuracy")
            if not metric:
                continue
            for shots, block in entry["shots"].items():
                if metric in block["metrics"]:
                    by_shots.setdefault(shots, {})[entry["column"]] = 100 * block["metrics"][metric]
        for shots, accs in sorted(by_shots.items()):
            row = {"model": run.model, "shots": int(shots), **accs}
            paper_present = [t for t in PAPER_TASKS if t in accs]
            if len(paper_present) == len(PAPER_TASKS):
                row["avg8"] = sum(accs[t] for t in PAPER_TASKS) / len(PAPER_TASKS)
            row["avg"] = sum(accs.values()) / len(accs)
            rows.append(row)
    if not rows:
        raise ValueError("table2: no accuracy task in the runs' eval.json (eval.tasks of the scale has none)")
    ours = pd.DataFrame(rows)
    tasks = [t for t in PAPER_TASKS + ["avg8"] if t in ours] + sorted(c for c in ours.columns if c not in PAPER_TASKS + ["model", "shots", "avg8", "avg"])
    quantities = tasks + ["avg"]
    notes = [M.describe("accuracy"), "avg: mean over the tasks evaluated; avg8: over the paper's eight tasks."]
    df = _side_by_side(ours, reference("table2_accuracy"), ["model", "shots"], quantities)
    return df.sort_values(["shots"], kind="stable").reset_index(drop=True), notes


def table3(cfg, results: Path, bench_json: Path | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Decoding latency per token at batch 1 (the decode benchmark's JSON)."""
    bench = read_json(bench_json or results / "bench" / "decode.json")
    rows = []
    for r in bench["rows"]:
        rows.append({"model": r["model"], "K": r["K"], "params_m": r["params_m"],
                     "latency_ms_per_token": r["latency_ms_per_token"]["mean"],
                     "latency_std_ms": r["latency_ms_per_token"]["std"],
                     "throughput_tok_s": r["throughput_tok_s"]["mean"],
                     "latency_change_pct": r["latency_change_pct"]})
    ours = pd.DataFrame(rows)
    s = bench["settings"]
    notes = [f"batch 1, prefill {s['prefill_tokens']} + {s['new_tokens']} new tokens, {s['runs']} runs, "
             f"{s['dtype']} on {s['device']}; change relative to {s['reference']}."]
    quantities = ["params_m", "latency_ms_per_token", "latency_std_ms", "throughput_tok_s", "latency_change_pct"]
    return _side_by_side(ours, reference("table3_decoding"), ["model", "K"], quantities), notes


def table4(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Ablations: held-out perplexity of the variants at K = 7."""
    runs = {run.model: run for run in _runs(cfg, "table4")}
    rows = []
    for ablation, variant in TABLE4_GROUPS:
        if variant not in runs:
            raise KeyError(f"experiments.table4.models: {variant} is missing (Table 4 compares it)")
        run = runs[variant]
        ev = read_json(results / "runs" / run.id / "eval.json")
        rows.append({"ablation": ablation, "variant": variant, "params_m": round(_params(run) / 1e6, 2),
                     "pile_ppl": ev["heldout"]["ppl"]})
    notes = [f"pile_ppl: token perplexity on {heldout_description(cfg, list(runs.values()))}."]
    return _side_by_side(pd.DataFrame(rows), reference("table4_ablations"), ["ablation", "variant"], ["params_m", "pile_ppl"]), notes


TABLES = {"table1": table1, "table2": table2, "table3": table3, "table4": table4}


def to_markdown(df: pd.DataFrame, notes: list[str], title: str) -> str:
    """One column per quantity: ``ours (paper, +diff)``."""
    keys = [c for c in df.columns if not c.endswith(("_paper", "_diff")) and f"{c}_paper" not in df.columns]
    quantities = [c for c in df.columns if f"{c}_paper" in df.columns]

    def fmt(v) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    header = keys + quantities
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in df.iterrows():
        cells = [fmt(row[k]) for k in keys]
        for q in quantities:
            ours, paper, diff = row[q], row[f"{q}_paper"], row[f"{q}_diff"]
            cell = fmt(ours)
            if not (isinstance(paper, float) and math.isnan(paper)):
                cell += f" ({fmt(paper)}, {diff:+.2f})" if not math.isnan(diff) else f" ({fmt(paper)})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Cells: ours (paper, ours - paper).", *notes, ""]
    return "\n".join(lines)
