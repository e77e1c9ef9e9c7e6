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

from stateloop.analysis.request import DecodeRequest as Request
from stateloop.experiments import load_checked
from stateloop.ops.cluster import check_cluster_file

SUBCOMMANDS = {"decode": "per-token latency and throughput at batch 1 (Table 3)"}


def run(request: Request) -> int:
    check_cluster_file(request.config)
    from stateloop.ops.bench_decode import run_stage  # lazy: torch

    return run_stage(request, load_checked(request.config, expand=False)[0] if request.config else None)
