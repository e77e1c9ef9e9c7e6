"""The GPU check's steps (benchmarks/gpu_check.py runs them), in the order the plan needs them
first: the ceiling, eager against compiled MFU, the peaks beside the plan, FSDP2; then the kernels
and the numerics; decoding last. Each declares its cap and the arithmetic of its estimate."""

from gpu_steps import decoding, numerics, training

STEPS = [*training.STEPS, *numerics.STEPS, *decoding.STEPS, numerics.LAST]
CAP_TOTAL_S = 420  # the caps' sum on an H100: the whole check, with room for a rerun, in a 15-minute lease

__all__ = ["CAP_TOTAL_S", "STEPS"]
