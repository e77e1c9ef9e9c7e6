"""``stateloop bench decode``: per-token decoding latency and throughput (paper, Table 3).

Models come from trained runs (``--runs RUN ...``; each RUN a run folder or a run id, as in every
command that addresses runs: runs.resolve_run_arg), or are built untrained from a shape
(``--models name:K[:d_s] ...`` at ``--scale`` of ``--config``, with ``--set model.key=value``
overrides); with neither, the shapes of the decoding experiment of ``--config`` at its scale (with
``--scale``, or without ``--config``: Table 3's rows at that shape). The timing protocol is the
``bench:`` section of ``--config`` (pipeline.BenchConfig; its defaults without it), which the flags
``--prefill`` ... ``--interleave`` override. Examples::

    stateloop bench decode --config configs/paper.yaml          # Table 3 as the config sets it (bench:, decoding)
    stateloop bench decode --set model.d_model=128 model.d_ff=344 model.n_heads=2 \\
        --models vanilla_looped:4 stateloop:4:128 --prefill 64 --tokens 64 --out bench.json
"""

from __future__ import annotations

import argparse

from stateloop.commands import RUN_HELP
from stateloop.report.outputs import BENCH_FILE


def threads(text: str) -> int:
    """``--threads``: a whole number >= 1 (torch rejects 0 and below with a traceback)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of threads >= 1, got {text}")
    return n


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    d = sub.add_parser("decode", help="per-token latency and throughput at batch 1 (Table 3)",
                       description="per-token latency and throughput at batch 1 (Table 3)")
    d.add_argument("--runs", nargs="+", default=[], metavar="RUN",
                   help=f"trained runs to time, each {RUN_HELP}")
    d.add_argument("--models", nargs="+", default=[], metavar="SPEC",
                   help="untrained models name[:K[:d_s]] (default without --runs: the --config's decoding experiment, "
                        "else Table 3's rows)")
    d.add_argument("--config", help="pipeline config: its bench: section, its decoding experiment's shapes and scale")
    d.add_argument("--scale", help="scale of --config whose shape untrained models take (default: the decoding experiment's)")
    d.add_argument("--set", nargs="+", default=[], metavar="model.KEY=VALUE", help="shape overrides for untrained models")
    # The next six override bench.* of --config (BenchConfig's defaults without it: the paper's protocol)
    d.add_argument("--prefill", type=int, help="prompt tokens P (paper: 1024)")
    d.add_argument("--tokens", type=int, help="generated tokens N (paper: 1024)")
    d.add_argument("--repeats", type=int, help="timed runs per model (paper: 5)")
    d.add_argument("--warmup", type=int, help="untimed warm-up runs per model (default 1)")
    d.add_argument("--dtype", help="auto (default: bfloat16 on CUDA, else float32), float32, bfloat16, float16")
    d.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    d.add_argument("--threads", type=threads, help="CPU threads for torch, >= 1 (default: torch's choice)")
    d.add_argument("--interleave", choices=["run", "token"],
                   help="run: whole runs round-robin across models (paper protocol); token (default): models decode in "
                        "lockstep, one token each in turn, synced per step (robust ratios on a busy CPU)")
    d.add_argument("--reference", help="row label the relative latency is taken against (default: the first row)")
    d.add_argument("--seed", type=int, default=0, help="seed of the prompt and of untrained weights")
    d.add_argument("--out", default=f"results/{BENCH_FILE}", help="JSON result (written atomically)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from stateloop.analysis.bench_decode import Request, run_stage
    from stateloop.pipeline import load_pipeline

    return run_stage(Request.of(args), load_pipeline(args.config) if args.config else None)
