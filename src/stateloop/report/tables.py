"""Tables 1-4: our numbers from the run folders over their seeds, the paper's beside them.

One row per cell; for each quantity ``q`` the columns ``q`` (mean over seeds), ``q_lo`` / ``q_hi``
(95% t interval, ``stateloop.report.stats``), ``q_paper`` and ``q_diff`` (ours - paper), the
difference formed for scale-free quantities (relative to Vanilla Looped, or StateLoop in Table 4;
paired by seed) and for absolute ones only at a ``paper: true`` scale. A missing result is an
error naming the file, never a blank cell. Experiments -> tables:
docs/architecture.md#which-experiment-feeds-which-output.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import pandas as pd

from stateloop.config.evaluate import PAPER_TASKS as EVAL_TASKS
from stateloop.evaluate import metrics as M
from stateloop.experiments import cells, expand_runs
from stateloop.models.flops import compute_profile
from stateloop.models.registry import count_params
from stateloop.report.outputs import BENCH_FILE
from stateloop.report.stats import Estimate, paired, relative_pct, t_interval

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


def fact(figure: str, quantity: str) -> float:
    """A number the paper states about a figure (``reference/figures_text.csv``)."""
    facts = reference("figures_text")
    return float(facts[(facts.figure == figure) & (facts.quantity == quantity)].value.iloc[0])


def heldout_ppl(results: Path, run) -> float:
    """A run's held-out PPL (its eval.json)."""
    return read_json(results / "runs" / run.id / "eval.json")["heldout"]["ppl"]


def heldout_by_seed(results: Path, runs) -> dict[int, float]:
    """{seed: held-out PPL} over the runs of a cell."""
    return {run.seed: heldout_ppl(results, run) for run in runs}


def _runs(cfg, experiment: str):
    if experiment not in cfg.experiments:
        raise KeyError(f"experiments.{experiment}: the config defines no such experiment (needed by this table)")
    return expand_runs(cfg, [experiment])


def _params(run) -> int:
    return count_params(run.model_config)


def heldout_description(cfg, runs) -> str:
    """Which data the held-out perplexity of these runs is measured on, in words (one scale)."""
    scales = sorted({run.scale for run in runs})
    parts = []
    for scale in scales:
        sc = cfg.scales[scale]
        split = sc.eval.heldout_split
        source = sc.data.source if isinstance(sc.data.source, str) else ", ".join(sc.data.source)
        where = sc.data.val_description if split == "val" else f"its {split!r} split"
        parts.append(f"the {split!r} split of {source} ({where}; {windows_note(sc)})" + (f" at scale {scale}" if len(scales) > 1 else ""))
    return "; ".join(parts)


def windows_note(scale) -> str:
    """How much of the held-out split a scale evaluates: the whole split, or its cap in windows
    (``eval.heldout_windows``), said wherever a table reports held-out perplexity."""
    n = scale.eval.heldout_windows
    if n is None:
        return "the whole split"
    length = scale.eval.max_length or scale.train.seq_len
    return f"capped at its first {n:,} windows of {length:,} tokens (eval.heldout_windows), not the whole split"


def put(row: dict, q: str, value, paper: float = math.nan, comparable: bool = True, se: float | None = None) -> None:
    """Set quantity ``q`` of a table row: our value (an :class:`Estimate` over seeds, or an exact
    number), the paper's, and ours - paper when ``comparable``."""
    est = value if isinstance(value, Estimate) else Estimate(float(value), math.nan, math.nan, 1, "exact")
    paper = float(paper) if paper is not None else math.nan
    row[q], row[f"{q}_lo"], row[f"{q}_hi"] = est.mean, est.lo, est.hi
    if se is not None:
        row[f"{q}_se"] = se
    row[f"{q}_paper"] = paper
    row[f"{q}_diff"] = est.mean - paper if comparable else math.nan


def _paper_value(ref: pd.DataFrame, key, column: str) -> float:
    try:
        return float(ref.loc[key, column])
    except KeyError:
        return math.nan


def _is_paper_scale(cfg, runs) -> bool:
    """Absolute numbers are compared with the paper's only at the paper's own scales."""
    return bool(runs) and all(cfg.scales[r.scale].paper for r in runs)


def _scale_note(cfg, runs) -> str:
    if _is_paper_scale(cfg, runs):
        return "Cells: ours as mean [95% CI over seeds] (paper, ours - paper)."
    scales = ", ".join(sorted({r.scale for r in runs}))
    return (f"Cells: ours as mean [95% CI over seeds] (paper, ours - paper). Scale {scales} is not the paper's: "
            "absolute numbers (parameters, PPL, accuracy, latency) are shown beside the paper's without a "
            "difference; compare the relative columns (change against the reference model, paired by seed).")


def _seeds_note(groups: dict) -> str:
    counts = sorted({len(rs) for rs in groups.values()})
    seeds = sorted({r.seed for rs in groups.values() for r in rs})
    return (f"Seeds per row: {', '.join(map(str, counts))} (seeds {', '.join(map(str, seeds))}); intervals are "
            "Student-t over seeds, relative changes paired by seed (stateloop.report.stats).")


def _reference_cell(groups: dict, model: str) -> list | None:
    """The runs of ``model``'s first cell."""
    return next((rs for rs in groups.values() if rs[0].model == model), None)


# ----------------------------------------------------------------------------------------------


def table1(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Perplexities: held-out (the paper's Pile column), LAMBADA-OpenAI (token), WikiText-2 (word),
    each model's held-out PPL change against Vanilla Looped, parameters and compute."""
    runs = _runs(cfg, "table1")
    groups = cells(runs)
    comparable = _is_paper_scale(cfg, runs)
    ref = reference("table1_ppl").set_index("model")
    values: dict[str, dict[int, dict[str, float]]] = {}
    for cell, rs in groups.items():
        values[cell] = {}
        for run in rs:
            ev = read_json(results / "runs" / run.id / "eval.json")
            cols = {"pile_ppl": ev["heldout"]["ppl"]}
            for task, entry in ev.get("tasks", {}).items():
                metric = entry.get("reported", {}).get("perplexity")
                block = entry["shots"].get("0")
                if metric and block and metric in block["metrics"]:
                    names = {"lambada_openai": "lambada_openai_ppl", "wikitext": "wikitext2_word_ppl"}
                    col = names.get(entry["column"], f"{entry['column']}_ppl")
                    cols[col] = block["metrics"][metric]
            values[cell][run.seed] = cols
    base = _reference_cell(groups, "vanilla_looped")
    base_count = _params(base[0]) if base else None
    base_flops = compute_profile(base[0].model_config, cfg.scales[base[0].scale].train.seq_len).flops_per_token if base else None
    paper_base_ppl = _paper_value(ref, "vanilla_looped", "pile_ppl")
    ppl_cols = ["pile_ppl", "lambada_openai_ppl", "wikitext2_word_ppl"]
    ppl_cols += sorted({c for v in values.values() for cols in v.values() for c in cols} - set(ppl_cols))
    rows = []
    for cell, rs in groups.items():
        run = rs[0]
        count = _params(run)
        prof = compute_profile(run.model_config, cfg.scales[run.scale].train.seq_len)
        row = {"model": run.model, "run": cell, "seeds": len(rs)}
        put(row, "params_m", round(count / 1e6, 2), _paper_value(ref, run.model, "params_m"), comparable)
        # exact counts: counts rounded to 0.01M are off by whole points at small scales
        put(row, "params_vs_vanilla_pct", 100 * (count / base_count - 1) if base_count else math.nan,
            _paper_value(ref, run.model, "params_vs_vanilla_pct"))
        for col in ppl_cols:
            by_seed = {seed: cols[col] for seed, cols in values[cell].items() if col in cols}
            if by_seed:
                put(row, col, t_interval(list(by_seed.values())), _paper_value(ref, run.model, col), comparable)
        if base:
            ours = {seed: cols["pile_ppl"] for seed, cols in values[cell].items()}
            theirs = {seed: cols["pile_ppl"] for seed, cols in values[base[0].cell].items()}
            put(row, "pile_ppl_vs_vanilla_pct", paired(ours, theirs, relative_pct),
                relative_pct(_paper_value(ref, run.model, "pile_ppl"), paper_base_ppl))
        row["layer_apps_per_token"] = round(prof.layer_applications_per_token, 2)
        row["flops_vs_vanilla_pct"] = 100 * (prof.flops_per_token / base_flops - 1) if base_flops else math.nan
        rows.append(row)
    notes = [_scale_note(cfg, runs), _seeds_note(groups),
             f"pile_ppl: token perplexity on {heldout_description(cfg, runs)}; pile_ppl_vs_vanilla_pct: its change "
             "against Vanilla Looped in percent, per seed then averaged.",
             "layer_apps_per_token: decoder-layer applications per token (loop iterations unrolled); "
             "flops_vs_vanilla_pct: training matmul FLOPs per token against Vanilla Looped, both counted "
             "from the real forward and backward pass at the training length (models/flops.py).",
             M.describe("perplexity")]
    return pd.DataFrame(rows), notes


def table2(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Accuracy (%) on the evaluation tasks at 0 and 5 shots, and their average; the average's
    change against Vanilla Looped in points; a first row with each task's chance level."""
    runs = _runs(cfg, "table1")
    groups = cells(runs)
    comparable = _is_paper_scale(cfg, runs)
    ref = reference("table2_accuracy").set_index(["model", "shots"])
    acc: dict[tuple[str, int], dict[int, dict[str, float]]] = {}  # (cell, shots) -> seed -> column -> %
    se: dict[tuple[str, int], dict[str, list[float]]] = {}  # lm-eval's standard errors, per seed
    chance: dict[str, float] = {}
    for cell, rs in groups.items():
        for run in rs:
            ev = read_json(results / "runs" / run.id / "eval.json")
            for task, entry in ev.get("tasks", {}).items():
                metric = entry.get("reported", {}).get("accuracy")
                if not metric:
                    continue
                for shots, block in entry["shots"].items():
                    if metric not in block["metrics"]:
                        continue
                    key, col = (cell, int(shots)), entry["column"]
                    acc.setdefault(key, {}).setdefault(run.seed, {})[col] = 100 * block["metrics"][metric]
                    if f"{metric}_stderr" in block["metrics"]:
                        se.setdefault(key, {}).setdefault(col, []).append(100 * block["metrics"][f"{metric}_stderr"])
                    level = block.get("chance", M.CHANCE.get(col))
                    if level is not None:
                        chance.setdefault(col, 100 * level)
    if not acc:
        raise ValueError("table2: no accuracy task in the runs' eval.json (eval.tasks of the scale has none)")
    tasks = [t for t in PAPER_TASKS if any(t in c for v in acc.values() for c in v.values())]
    tasks += sorted({c for v in acc.values() for cols in v.values() for c in cols} - set(tasks))
    base = _reference_cell(groups, "vanilla_looped")

    def averages(cols: dict[str, float]) -> dict[str, float]:
        out = {"avg": sum(cols.values()) / len(cols)}
        if all(t in cols for t in PAPER_TASKS):
            out["avg8"] = sum(cols[t] for t in PAPER_TASKS) / len(PAPER_TASKS)
        return out

    rows = []
    shot_counts = sorted({shots for _, shots in acc})
    for shots in shot_counts:
        row = {"model": "chance", "shots": shots, "seeds": 0}
        for t in tasks:
            put(row, t, chance.get(t, math.nan))
        rows.append(row)
    for shots in shot_counts:
        for cell, rs in groups.items():
            if (cell, shots) not in acc:
                continue
            by_seed = acc[(cell, shots)]
            model = rs[0].model
            row = {"model": model, "shots": shots, "seeds": len(by_seed)}
            for t in tasks:
                vals = [cols[t] for cols in by_seed.values() if t in cols]
                if vals:
                    errs = se.get((cell, shots), {}).get(t)
                    put(row, t, t_interval(vals), _paper_value(ref, (model, shots), t), comparable,
                        se=sum(errs) / len(errs) if errs else None)
            avgs = {seed: averages(cols) for seed, cols in by_seed.items()}
            for name in ("avg8", "avg"):
                vals = [a[name] for a in avgs.values() if name in a]
                if vals:
                    put(row, name, t_interval(vals), _paper_value(ref, (model, shots), "avg8") if name == "avg8" else math.nan,
                        comparable)
            if base and (base[0].cell, shots) in acc:
                theirs = {seed: averages(cols)["avg"] for seed, cols in acc[(base[0].cell, shots)].items()}
                paper = _paper_value(ref, (model, shots), "avg8") - _paper_value(ref, ("vanilla_looped", shots), "avg8")
                put(row, "avg_vs_vanilla_pts", paired({s: a["avg"] for s, a in avgs.items()}, theirs), paper)
            rows.append(row)
    notes = [_scale_note(cfg, runs), _seeds_note(groups), M.describe("accuracy"),
             "se: lm-eval's own standard error of the accuracy (mean over seeds; eval.bootstrap_iters > 0).",
             "chance: the accuracy of guessing uniformly among each example's choices (from the evaluated "
             "examples where lm-eval logged them); '-' for open-ended tasks.",
             "avg: mean over the tasks evaluated; avg8: over the paper's eight tasks; avg_vs_vanilla_pts: avg "
             "minus Vanilla Looped's, paired by seed (the paper's: its avg8 difference)."]
    return pd.DataFrame(rows), notes


def table3(cfg, results: Path, bench_json: Path | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Decoding latency per token at batch 1 (the decode benchmark's JSON): mean and std over
    runs as the paper reports them; the change against the reference with its interval over runs
    (paired run by run: the models were timed side by side)."""
    bench = read_json(bench_json or results / BENCH_FILE)
    ref = reference("table3_decoding").set_index(["model", "K"])
    scale = cfg.experiments["decoding"].scale if "decoding" in cfg.experiments else None
    comparable = bool(scale and cfg.scales[scale].paper)
    s = bench["settings"]
    base = next(r for r in bench["rows"] if r["label"] == s["reference"])
    base_runs = dict(enumerate(base["latency_ms_per_token"]["runs"]))
    rows = []
    for r in bench["rows"]:
        key = (r["model"], r["K"])
        row = {"model": r["model"], "K": r["K"], "runs": len(r["latency_ms_per_token"]["runs"])}
        put(row, "params_m", r["params_m"], _paper_value(ref, key, "params_m"), comparable)
        put(row, "latency_ms_per_token", r["latency_ms_per_token"]["mean"], _paper_value(ref, key, "latency_ms_per_token"), comparable)
        put(row, "latency_std_ms", r["latency_ms_per_token"]["std"], _paper_value(ref, key, "latency_std_ms"), comparable)
        put(row, "throughput_tok_s", r["throughput_tok_s"]["mean"], _paper_value(ref, key, "throughput_tok_s"), comparable)
        ours = dict(enumerate(r["latency_ms_per_token"]["runs"]))
        put(row, "latency_change_pct", paired(ours, base_runs, relative_pct), _paper_value(ref, key, "latency_change_pct"))
        if "flops_change_pct" in r:  # benchmarks written before the floor was recorded have none
            row["flops_floor_pct"] = r["flops_change_pct"]
        rows.append(row)
    alone = "interleaved in lockstep, one token each in turn" if s.get("interleave") == "token" else "whole runs round-robin"
    notes = [f"batch 1, prefill {s['prefill_tokens']} + {s['new_tokens']} new tokens, {s['runs']} runs ({alone}; the "
             f"job ran alone), {s['dtype']} on {s['device']}; latency: mean and std over runs; change relative to "
             f"{s['reference']}, with its 95% t interval over runs paired run by run.",
             "flops_floor_pct: the change in FLOPs per decoded token (matmuls and attention over the cache, "
             "models/flops.py) at this shape and context: what the latency change would be if time followed "
             "arithmetic alone; a change above it is overhead (memory traffic, per-operator cost).",
             "Absolute latencies depend on the machine: compared with the paper's only at the paper's scale on its GPU."
             if not comparable else "The paper's scale: absolute latencies compared with the paper's."]
    return pd.DataFrame(rows), notes


def table4(cfg, results: Path) -> tuple[pd.DataFrame, list[str]]:
    """Ablations: held-out perplexity of the variants at K = 7 and its change against StateLoop."""
    runs = _runs(cfg, "table4")
    groups = cells(runs)
    comparable = _is_paper_scale(cfg, runs)
    by_model = {rs[0].model: rs for rs in groups.values()}
    ref = reference("table4_ablations").set_index(["ablation", "variant"])
    paper_sl = _paper_value(ref, ("feedback", "stateloop"), "pile_ppl")
    ppl = {model: heldout_by_seed(results, rs) for model, rs in by_model.items()}
    rows = []
    for ablation, variant in TABLE4_GROUPS:
        if variant not in by_model:
            raise KeyError(f"experiments.table4.models: {variant} is missing (Table 4 compares it)")
        rs = by_model[variant]
        row = {"ablation": ablation, "variant": variant, "seeds": len(rs)}
        put(row, "params_m", round(_params(rs[0]) / 1e6, 2), _paper_value(ref, (ablation, variant), "params_m"), comparable)
        put(row, "pile_ppl", t_interval(list(ppl[variant].values())), _paper_value(ref, (ablation, variant), "pile_ppl"), comparable)
        if "stateloop" in ppl:
            put(row, "pile_ppl_vs_stateloop_pct", paired(ppl[variant], ppl["stateloop"], relative_pct),
                relative_pct(_paper_value(ref, (ablation, variant), "pile_ppl"), paper_sl))
        rows.append(row)
    notes = [_scale_note(cfg, runs), _seeds_note(groups),
             f"pile_ppl: token perplexity on {heldout_description(cfg, runs)}; pile_ppl_vs_stateloop_pct: its "
             "change against StateLoop in percent, per seed then averaged."]
    return pd.DataFrame(rows), notes


TABLES = {"table1": table1, "table2": table2, "table3": table3, "table4": table4}


def to_markdown(df: pd.DataFrame, notes: list[str], title: str) -> str:
    """One column per quantity: ``mean [lo, hi] se E (paper P, +diff)``; the notes underneath."""
    suffixes = ("_lo", "_hi", "_se", "_paper", "_diff")
    quantities = [c for c in df.columns if f"{c}_paper" in df.columns]
    keys = [c for c in df.columns if c not in quantities and not (c.endswith(suffixes) and c.rsplit("_", 1)[0] in quantities)]

    def nan(v) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    def fmt(v) -> str:
        return "-" if nan(v) else (f"{v:.2f}" if isinstance(v, float) else str(v))

    lines = [f"# {title}", "", "| " + " | ".join(keys + quantities) + " |", "|" + "---|" * (len(keys) + len(quantities))]
    for _, row in df.iterrows():
        cells_ = [fmt(row[k]) for k in keys]
        for q in quantities:
            cell = fmt(row[q])
            if not nan(row[q]) and not nan(row.get(f"{q}_lo")):
                cell += f" [{fmt(row[f'{q}_lo'])}, {fmt(row[f'{q}_hi'])}]"
            if not nan(row.get(f"{q}_se")):
                cell += f" se {fmt(row[f'{q}_se'])}"
            paper, diff = row[f"{q}_paper"], row[f"{q}_diff"]
            if not nan(paper):
                cell += f" (paper {fmt(paper)}" + (f", {diff:+.2f})" if not nan(diff) else ")")
            cells_.append(cell)
        lines.append("| " + " | ".join(cells_) + " |")
    lines += ["", *notes, ""]
    return "\n".join(lines)
