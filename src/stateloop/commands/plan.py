"""``stateloop plan --config CONFIG``: what training every run of a config costs.

For each run: parameters, tokens, training FLOPs (models/flops.py), the planned peak memory per
GPU (ops/memory.py), and the time at an MFU: step, wall time, SLURM jobs, GPU-hours (ops/cost.py);
then totals per experiment and overall. ``--compare-strategies``: each run's alternatives. Where a
GPU's memory is known, the plan also chooses each run's fastest setting that fits (``--margin``).
The whole plan is printed first; the exit status then says whether it holds (:data:`EPILOG`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from stateloop.config import POSITIVE, Bool, Float, Int, StageRequest, Text, arg
from stateloop.experiments import expand_runs, load_pipeline
from stateloop.ops import mfu as measured_mfu
from stateloop.ops.cluster import check_cluster
from stateloop.ops.cost import DEFAULT_MARGIN, DEFAULT_PEAK_TFLOPS, Network, doc_tables, plan_rows, print_plan, write_doc_tables
from stateloop.ops.mfu import FALLBACK_MFU, RECORDS_ENV

EPILOG = ("Exit status: 0 every run fits its train.gpu_memory_gib (or the scale sets none); 1 the whole plan is "
          "printed, but a run does not fit its train.gpu_memory_gib (DOES NOT FIT) or, with --analyses, a job is "
          "past its runtime limit (a line on stderr says how many); 2 a bad flag or config (one line, no plan).")


class Request(StageRequest):
    config: Text = arg("pipeline config (configs/*.yaml)")
    experiments: list[Text] | None = arg("only these experiments (default: all)", None)
    mfu: Float | None = arg("model FLOPs utilisation assumed for every run (default: measured, the newest GPU record's "
                            "for each scale's train.compile, named on the first line; a constant "
                            f"{FALLBACK_MFU:.2f}, with a warning, where there is none: ops/mfu.py)", None,
                            check=(lambda v: 0 < v <= 1, "in (0, 1]"))
    records: Text | None = arg(f"the GPU records' folder (default: ${RECORDS_ENV}, else the repository's benchmarks/records/)",
                              None)
    peak_tflops: Float = arg(f"per-GPU peak, TFLOP/s (default {DEFAULT_PEAK_TFLOPS:g}: H100/H200 SXM dense bf16)", DEFAULT_PEAK_TFLOPS,
                             check=POSITIVE)
    inter_node_gbps: Float = arg(f"network bandwidth per node between nodes, Gb/s (default {Network.inter_node_gbps:g}: one "
                                 f"400 Gb/s InfiniBand port; 8 ports: 3200)", Network.inter_node_gbps, check=POSITIVE)
    intra_node_gbs: Float = arg(f"bandwidth per GPU within a node, GB/s (default {Network.intra_node_gbs:g}: NCCL over NVLink, "
                                f"8 x H100 SXM)", Network.intra_node_gbs, check=POSITIVE)
    compare_strategies: Bool = arg("also each run's alternatives: DDP or FSDP (full, grad_op; hybrid ones on several nodes), "
                                   "micro-batch 1/2/4/8, activation checkpointing none/layer/iteration, the loss whole or "
                                   "per sequence; memory and time of each, the fastest that fits marked", False)
    gpu_memory_gib: Float | None = arg("device memory the alternatives must fit (default: the scale's train.gpu_memory_gib; "
                                       "unset: not judged)", None, check=POSITIVE)
    margin: Float = arg(f"share of the device memory a chosen setting leaves free (default {DEFAULT_MARGIN:g}): the plan "
                        "chooses each run's strategy, the fastest DDP setting within the limit less the margin, else the "
                        "fastest sharded one, and judges the alternatives by the same rule", DEFAULT_MARGIN,
                        check=(lambda v: 0 <= v < 1, "in [0, 1)"))
    top: Int = arg("alternatives shown per run, fastest first (default 6)", 6, check=POSITIVE)
    analyses: Bool = arg("also every evaluation and analysis job (held-out PPL, Shapley and intervention shards, their "
                         "merges): FLOPs and hours on one GPU against the job's runtime limit (ops/analysis_cost.py)", False)
    out: Text | None = arg("also write the per-run rows as CSV here", None)
    doc_tables: Text | None = arg("also write the plan's figures as the documentation's data files plan_<config>*.csv in this "
                                 "folder (docs/tables): those it has, else all; then python scripts/results_doc.py renders "
                                 "the pages", None)


def plan_mfu(cfg, mfu: float | None = None, records: str | None = None) -> measured_mfu.PlanMfu:
    """The MFU of each scale the config trains (the analyses' jobs, too, are of every trained run):
    ``mfu`` where given, else the GPU records' (ops/mfu.py)."""
    scales = sorted({run.scale for run in expand_runs(cfg)})
    if mfu is not None:
        return measured_mfu.explicit(mfu, scales)
    return measured_mfu.resolve({s: bool(cfg.scales[s].train.compile) for s in scales},
                                None if records is None else Path(records))


def run(args: Request) -> int:
    network = Network(args.inter_node_gbps, args.intra_node_gbs)
    cfg = load_pipeline(args.config)
    check_cluster(cfg, args.config)
    mfu = plan_mfu(cfg, args.mfu, args.records)
    print(mfu.source, flush=True)  # the first line: what the hours below rest on
    rows = plan_rows(cfg, args.experiments, mfu, args.peak_tflops, network, args.margin, args.gpu_memory_gib)
    unfit = print_plan(cfg, args.experiments, mfu, args.peak_tflops, args.out, network,
                       args.compare_strategies, args.gpu_memory_gib, args.top, args.margin, rows=rows)
    analyses, late = None, 0
    if args.analyses:
        from stateloop.ops.analysis_cost import analysis_plan_rows, print_analysis_plan  # lazy: torch

        analyses = analysis_plan_rows(cfg, mfu, args.peak_tflops)
        late = sum(r["fits"] is False for r in analyses)
        print(f"\nEvaluation and analysis jobs ({late} of {len(analyses)} past their limit):")
        print_analysis_plan(analyses, mfu, args.peak_tflops)
    if args.doc_tables:
        tables = doc_tables(Path(args.config).stem, rows, mfu, args.peak_tflops, network, args.margin, analyses)
        for path in write_doc_tables(tables, Path(args.doc_tables)):
            print(f"wrote {path}")
    said = [f"{unfit} run(s) do not fit their train.gpu_memory_gib (marked DOES NOT FIT)" if unfit else "",
            f"{late} evaluation or analysis job(s) past their runtime limit" if late else ""]
    if unfit or late:
        print(f"stateloop plan: {'; '.join(s for s in said if s)} (exit 1)", file=sys.stderr)
        return 1
    return 0
