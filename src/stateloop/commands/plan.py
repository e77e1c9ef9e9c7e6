"""``stateloop plan --config CONFIG``: what training every run of a config costs.

For each run: parameters, decoder-layer applications per token (loop iterations unrolled),
training tokens (the scale's ``train`` budget), training FLOPs (forward + backward matmuls
counted on the meta device, models/flops.py) and GPU-hours at a given MFU and per-GPU peak.
Then totals per experiment (a run shared by several experiments counts in each) and overall
(each run once).
"""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="pipeline config (configs/*.yaml)")
    p.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    p.add_argument("--mfu", type=float, default=0.40, help="model FLOPs utilisation assumed (default 0.40)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="per-GPU peak, TFLOP/s (default 989: H100 SXM dense bf16)")
    p.add_argument("--out", help="also write the per-run rows as CSV here")


def run(args) -> int:
    from stateloop.pipeline import load_pipeline
    from stateloop.train.cost import print_plan

    if not 0 < args.mfu <= 1:
        print(f"stateloop plan: error: --mfu must be in (0, 1], got {args.mfu}", file=sys.stderr)
        return 2
    return print_plan(load_pipeline(args.config), args.experiments, args.mfu, args.peak_tflops, args.out)
