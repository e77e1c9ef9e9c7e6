# The report's side of the render rules (workflow/rules/report.smk): how each output is filed in
# `snakemake --report` (category, subcategory, labels, caption) and the facts its caption prints
# (scale, seeds, models), taken from the runs the output reads.
from stateloop.experiments import cells as _cells

_RUNS_BY_FOLDER = {r.folder: r for r in RUNS.values()}


def _numbers(values):
    return ", ".join(str(v) for v in sorted(values))


def _scale_text(name):
    """One line on a scale: its model size, training budget, data and device."""
    s = PIPE.scales[name]
    steps = s.train.total_steps
    tokens = f"{s.train.max_tokens:,} training tokens ({steps:,} steps)" if s.train.max_tokens else f"{steps:,} steps"
    paper = "the paper's own setup" if s.paper else "not the paper's scale: absolute numbers are not compared"
    layers = f"{s.model.n_layers} layer{'s' if s.model.n_layers != 1 else ''}"
    return f"d_model = {s.model.d_model}, {layers}, {tokens} per run, data {s.data.source}, {s.train.accelerator}; {paper}"


def _seeds_text(runs):
    """The seeds of ``runs``: all of them, then how many each cell has (cell by cell where cells
    differ)."""
    groups = {}
    for cell, rs in _cells(runs).items():
        _, model, shape = cell.split("/")
        groups.setdefault(len(rs), []).append(f"{model} {shape}")
    seeds = _numbers({r.seed for r in runs})
    if len(groups) == 1:
        (n,) = groups
        return f"{seeds} (one per cell: no interval)" if n == 1 else f"{seeds} ({n} per cell: mean and 95% interval over seeds)"
    return f"{seeds} (per cell: " + "; ".join(f"{n} for {', '.join(cs)}" for n, cs in sorted(groups.items())) + ")"


def _facts(runs, scale=None):
    scales = sorted({r.scale for r in runs} | ({scale} if scale else set()))
    n_cells = len(_cells(runs))
    return {
        "scale": ", ".join(scales),
        "scale_detail": "; ".join(f"{n}: {_scale_text(n)}" if len(scales) > 1 else _scale_text(n) for n in scales),
        "seeds": _seeds_text(runs) if runs else "none (untrained shapes)",
        "models": ", ".join(dict.fromkeys(r.model for r in runs)),
        "tasks": ", ".join(PIPE.scales[scales[0]].eval.tasks) if len(scales) == 1 else "",
        "shots": " and ".join(map(str, PIPE.scales[scales[0]].eval.shots)) if len(scales) == 1 else "",
        "count": f"{len(runs)} run{'s' if len(runs) != 1 else ''} in {n_cells} cell{'s' if n_cells != 1 else ''}",
    }


def report_facts(wildcards, input):
    """Params value for the report's captions: the scale, seeds and models of the runs this output
    reads (its input files under results/runs/). Taking ``input`` makes it a derived param, which
    Snakemake's params rerun trigger skips: the inputs and the config digest already decide reruns."""
    folders = dict.fromkeys(os.path.dirname(f) for f in input)
    runs = [_RUNS_BY_FOLDER[d] for d in folders if d in _RUNS_BY_FOLDER]
    if wildcards.get("table") and OUTPUTS[wildcards.table].bench:
        return _facts([], BENCH_SCALE) | {
            "repeats": PIPE.bench.repeats,
            "prefill": PIPE.bench.prefill,
            "tokens": PIPE.bench.tokens,
            "dtype": PIPE.bench.dtype,
            "reference": decode_models().split()[0],
        }
    facts = _facts(runs)
    if wildcards.get("experiment"):  # an experiment's own comparison
        return facts | {"experiment": wildcards.experiment, "baseline": baseline_of(PIPE, wildcards.experiment)}
    if not wildcards.get("table") and not wildcards.get("figure"):  # the claims: experiment by experiment
        facts["experiments"] = [
            {"name": name, **_facts([r for r in runs if name in r.experiments])} for name, exp in PIPE.experiments.items() if exp.trained
        ]
        if BENCH_SCALE is not None:
            facts["experiments"].append({"name": "decoding", **_facts([], BENCH_SCALE)})
    return facts


def _label(kind, fmt):
    return lambda wc: {kind: OUTPUTS[wc.get(kind)].label, "file": fmt}


def _table(path, fmt):
    return report(
        path, caption="../report/table.rst", category="Tables", subcategory=lambda wc: OUTPUTS[wc.table].title, labels=_label("table", fmt)
    )


def _figure(path, fmt):
    return report(
        path,
        caption="../report/figure.rst",
        category="Figures",
        subcategory=lambda wc: OUTPUTS[wc.figure].title,
        labels=_label("figure", fmt),
    )


def _comparison(path, fmt):
    return report(
        path,
        caption="../report/compare.rst",
        category="Comparisons",
        subcategory=lambda wc: f"Comparison: {wc.experiment}",
        labels=lambda wc: {"experiment": wc.experiment, "file": fmt},
    )


def _claims(path, fmt):
    return report(path, caption="../report/claims.rst", category="Claims", subcategory=OUTPUTS["claims"].title, labels={"file": fmt})


# The landing page (workflow/report/workflow.rst) sees nothing but Snakemake's config, where an
# experiment of the paper's that takes the paper's models (pipeline.PAPER_MODELS) names none.
# The experiments as this config resolves them go there under a key of their own, added after the
# config's digest is taken (common.smk): no job's config file and no rerun trigger sees it.
config["_report_experiments"] = {
    name: {"scale": exp.scale, "trained": exp.trained, "seeds": ", ".join(map(str, exp.seeds)), "models": ", ".join(exp.models)}
    for name, exp in PIPE.experiments.items()
}
