"""Model FLOPs for MFU: counted on the meta device, so loop iterations, the state update and the
mixers are all included as the model actually runs them (no 6N approximation).

    MFU = (FLOPs of forward + backward per sequence) x (sequences per second per device) / peak

Peak: ``train.peak_tflops`` when set, else the dense (no sparsity) bf16 tensor-core rate of the
device from its vendor datasheet (table below), else Lightning's table
(``lightning_fabric.utilities.throughput.get_available_flops``). No MFU on CPU.
"""

from __future__ import annotations

import torch

from stateloop.models.flops import compute_profile

# Dense bf16 tensor-core peak, FLOP/s (NVIDIA datasheets; matched by substring of the device name,
# most specific first). fp32 training on these would use the TF32 rate, which MFU does not report.
BF16_PEAK: list[tuple[str, float]] = [
    ("gh200", 989.4e12),
    ("h200", 989.4e12),  # H200 SXM
    ("h100 pcie", 756.0e12),
    ("h100 nvl", 835.5e12),
    ("h100", 989.4e12),  # H100 SXM
    ("a100", 312.0e12),
    ("l40s", 362.05e12),
    ("a6000", 154.8e12),
]


def flops_per_sequence(model_cfg, seq_len: int) -> int:
    """FLOPs of one forward + backward pass over one sequence of ``seq_len`` tokens
    (the count of :mod:`stateloop.models.flops`, which ``stateloop plan`` uses too)."""

    return round(compute_profile(model_cfg, seq_len).flops_per_token * seq_len)


def peak_flops(device: torch.device, precision: str, configured_tflops: float = 0.0) -> float | None:
    """Peak FLOP/s of one device for MFU, or None where MFU is not defined (CPU, unknown GPU)."""
    if configured_tflops > 0:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    if "bf16" in precision:
        name = torch.cuda.get_device_name(device).lower()
        for key, value in BF16_PEAK:
            if key in name:
                return value
    from lightning_fabric.utilities.throughput import get_available_flops

    dtype = {"bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16, "16-mixed": torch.float16}.get(precision, torch.float32)
    flops = get_available_flops(device, dtype)
    return float(flops) if flops else None
