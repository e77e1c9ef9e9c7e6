"""Every output of the DAG, once: its name, kind, what it reads, its title and files.

The CLI (``stateloop render``), the renderers and the Snakemake rules (workflow/rules/common.smk,
report.smk, workflow/report/captions.smk) all read this table; an output's name is spelled here.

    name            kind     reads experiment   files
    table1..table4  table    table1/table1/decoding/table4   results/NAME.csv + .md
    loop_depth ...  figure   loop_depth, state_width, state_analysis   figures/NAME.pdf + .png
    gap_vs_tokens   figure   loop_depth, table1, table4 (train.json)   the project's own, not the paper's
    state_diagnostics figure table4, loop_depth, table1 (eval.json)    the project's own, not the paper's
    gap_vs_compute  figure   ladder_1 .. ladder_5 (eval.json)          the project's own, not the paper's
    test_time_depth figure test_time_depth (eval_depth.json)       the project's own, not the paper's
    lr_sweep        figure   lr_1 .. lr_5 (eval.json)                  the project's own, not the paper's
    claims          claims   (every experiment)  results/claims.csv + .md
    compare         compare  NAME (any other)    results/compare_NAME.csv + .md; figures/compare_NAME.pdf + .png

Beside the outputs of this table, every experiment of two models or more that none of them reads
(:func:`comparisons`: an experiment of a config's own, e.g. a new model against Vanilla Looped)
gets a comparison of its own, named after it (report/compare.py).

What an output reads from its experiment's run folders (``run_files``), Table 3's timings
(``bench``: BENCH_FILE under the results folder) and a reference model's runs (``reference``)
decide its rule's inputs (common.smk, ``render_inputs``); the renderers read the same files.
"""

from __future__ import annotations

from dataclasses import dataclass

from stateloop.config import ConfigError
from stateloop.runs import BENCH_FILE as BENCH_FILE  # its home beside DEPTH_FILE: the bench request reads it
from stateloop.runs import DEPTH_FILE


@dataclass(frozen=True)
class Output:
    name: str
    kind: str  # "table" | "figure" | "claims"
    experiment: str | None  # the experiment whose runs it reads (None: every experiment)
    title: str  # the paper's numbering first: "Table 1: ..."
    run_files: tuple[str, ...] = ("eval.json",)  # what it reads in each run folder of its experiment
    bench: bool = False  # reads BENCH_FILE
    # a model whose runs at the experiment's loop counts it reads too (Figure 3's reference line)
    reference: str | None = None
    also: tuple[str, ...] = ()  # further experiments whose runs it reads, where the config defines them

    @property
    def experiments(self) -> tuple[str, ...]:
        """The experiments whose runs it reads; it is made when the config defines any of them."""
        return tuple(e for e in (self.experiment, *self.also) if e is not None)

    @property
    def files(self) -> tuple[str, str]:
        """(the file `stateloop render --out` names, its twin written beside it)."""
        if self.kind == "figure":
            return f"figures/{self.name}.pdf", f"figures/{self.name}.png"
        return f"results/{self.name}.csv", f"results/{self.name}.md"

    @property
    def label(self) -> str:
        """"Table 1", "Figure 2", ... (the title's part before the colon)."""
        return self.title.split(":")[0]


OUTPUTS: dict[str, Output] = {o.name: o for o in (
    Output("table1", "table", "table1", "Table 1: parameters and held-out perplexity"),
    Output("table2", "table", "table1", "Table 2: accuracy at 0 and 5 shots"),
    Output("table3", "table", "decoding", "Table 3: decoding latency per token", run_files=(), bench=True),
    Output("table4", "table", "table4", "Table 4: the ablations"),
    Output("loop_depth", "figure", "loop_depth", "Figure 2: perplexity against loop depth K"),
    Output("state_width", "figure", "state_width", "Figure 3: perplexity against the state's parameter overhead",
           reference="vanilla_looped"),
    Output("state_analysis", "figure", "state_analysis",
           "Figure 4: Shapley values of the state reads; replacement and freezing",
           run_files=("shapley.json", "interventions.json")),
    Output("gap_vs_tokens", "figure", "loop_depth", "Figure S1: the paired PPL gap against training tokens (ours)",
           run_files=("train.json",), also=("table1", "table4")),
    Output("state_diagnostics", "figure", "table4", "Figure S2: the state's diagnostics over the iterations (ours)",
           also=("loop_depth", "table1")),
    Output("gap_vs_compute", "figure", "ladder_1", "Figure S3: the paired PPL gap against training compute (ours)",
           also=("ladder_2", "ladder_3", "ladder_4", "ladder_5")),
    Output("test_time_depth", "figure", "test_time_depth",
           "Figure S4: held-out perplexity at test-time loop depths other than trained (ours)", run_files=(DEPTH_FILE,)),
    Output("lr_sweep", "figure", "lr_1", "Figure S5: held-out perplexity and the paired gap against the peak lr (ours)",
           also=("lr_2", "lr_3", "lr_4", "lr_5")),
    Output("claims", "claims", None, "The paper's claims, judged", bench=True),
)}


def of_kind(kind: str) -> list[str]:
    return [name for name, o in OUTPUTS.items() if o.kind == kind]


COMPARE = "compare"  # `stateloop render compare --experiment NAME`: an experiment's own comparison
DEFAULT_BASELINE = "vanilla_looped"  # what an experiment's models are compared with, unless it names a baseline


def comparisons(cfg) -> list[str]:
    """The experiments that get a comparison of their own: trained, of two models or more, and
    read by name by none of :data:`OUTPUTS` (Table 1 already compares its models); in config order.
    Each has its baseline (:func:`baseline_of`), else one line saying what to write (the Snakefile
    asks when it checks the config)."""
    read = {e for o in OUTPUTS.values() for e in o.experiments}
    names = [n for n, e in cfg.experiments.items() if e.trained and len(e.models or []) >= 2 and n not in read]
    for name in names:
        baseline_of(cfg, name)
    return names


def baseline_of(cfg, name: str) -> str:
    """The model experiment ``name``'s other models are compared with: its ``baseline``, else
    Vanilla Looped; one line saying what to write where it trains neither."""
    exp = cfg.experiments[name]
    if exp.baseline is not None:
        return exp.baseline
    if DEFAULT_BASELINE in exp.models:
        return DEFAULT_BASELINE
    raise ConfigError(f"experiments.{name}.baseline: missing: its models ({', '.join(exp.models)}) are each compared "
                      f"with a baseline, {DEFAULT_BASELINE} unless it names one, and it does not train "
                      f"{DEFAULT_BASELINE}; add `baseline: {exp.models[0]}` (or another of its models) to it")


def loop_counts(cfg, name: str, model: str) -> list[int]:
    """The loop counts experiment ``name`` trains ``model`` at."""
    exp = cfg.experiments[name]
    return list(exp.K_by_model.get(model, exp.K))


def varies_K(cfg, name: str) -> bool:
    """Whether the comparison of ``name`` has a figure (Figure 2's form): its baseline and another
    of its models at two loop counts or more."""
    baseline = baseline_of(cfg, name)
    base = set(loop_counts(cfg, name, baseline))
    return any(len(base & set(loop_counts(cfg, name, m))) >= 2 for m in cfg.experiments[name].models if m != baseline)


def comparison_files(name: str, figure: bool = False) -> tuple[str, str]:
    """(the file `stateloop render compare --out` names, its twin) of experiment ``name``'s
    comparison: its table (CSV, Markdown) or, with ``figure``, its figure (PDF, PNG)."""
    if figure:
        return f"figures/{COMPARE}_{name}.pdf", f"figures/{COMPARE}_{name}.png"
    return f"results/{COMPARE}_{name}.csv", f"results/{COMPARE}_{name}.md"
