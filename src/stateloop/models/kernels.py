"""The only module that imports fused CUDA kernels (flash-attn, mamba_ssm, causal-conv1d).

Every kernel has a pure-PyTorch twin with the same signature, used on CPU and whenever the
package is missing. ``impl`` selects: ``"auto"`` takes the kernel on CUDA tensors when the package
imports, ``"torch"`` never does, ``"kernel"`` requires it and fails loudly otherwise.
Tests force the torch path with ``impl="torch"``; ``tests/models/test_kernels_gpu.py`` compares
both on a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:  # pragma: no cover - only on GPU machines
    from flash_attn import flash_attn_func as _flash_attn_func

    HAS_FLASH_ATTN = True
except Exception:  # ImportError, or a build without its CUDA extension
    _flash_attn_func = None
    HAS_FLASH_ATTN = False

try:  # pragma: no cover - only on GPU machines
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as _mamba_chunk_scan_combined

    HAS_MAMBA_SSM = True
except Exception:
    _mamba_chunk_scan_combined = None
    HAS_MAMBA_SSM = False

try:  # pragma: no cover - only on GPU machines
    from causal_conv1d import causal_conv1d_fn as _causal_conv1d_fn

    HAS_CAUSAL_CONV1D = True
except Exception:
    _causal_conv1d_fn = None
    HAS_CAUSAL_CONV1D = False


def _use_kernel(impl: str, available: bool, tensor: torch.Tensor, what: str) -> bool:
    if impl == "torch":
        return False
    if impl == "kernel":
        if not available:
            raise RuntimeError(f"{what} kernel requested (impl='kernel') but the package is not importable")
        if not tensor.is_cuda:
            raise RuntimeError(f"{what} kernel requested (impl='kernel') but the tensors are on {tensor.device}")
        return True
    if impl != "auto":
        raise ValueError(f"impl must be auto, torch or kernel; got {impl!r}")
    return available and tensor.is_cuda


# ----------------------------------------------------------------------------------------------
# Causal attention


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Causal multi-head attention. q: (B, Tq, H, D); k, v: (B, Tk, H, D) with Tk >= Tq.

    The queries are the *last* Tq positions of the Tk keys (prefill with Tq = Tk, decoding with
    a KV cache otherwise): query i may attend to keys j <= Tk - Tq + i.
    """
    flash_ok = q.dtype in (torch.float16, torch.bfloat16)
    if _use_kernel(impl, HAS_FLASH_ATTN and flash_ok, q, "flash-attn"):
        # flash-attn >= 2.1 aligns the causal mask to the bottom-right corner, as we need.
        return _flash_attn_func(q, k, v, causal=True)
    return attention_ref(q, k, v)


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch twin of :func:`attention` (``scaled_dot_product_attention``)."""
    Tq, Tk = q.shape[1], k.shape[1]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    if Tq == Tk:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif Tq == 1:
        out = F.scaled_dot_product_attention(q, k, v)  # one new token sees the whole cache
    else:
        # SDPA's is_causal aligns top-left when Tq != Tk, so give the offset mask explicitly.
        offset = Tk - Tq
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=offset)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2)  # (B, Tq, H, D)


# ----------------------------------------------------------------------------------------------
# Mamba-2: depthwise causal convolution and the SSD scan


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, impl: str = "auto") -> torch.Tensor:
    """Depthwise causal convolution followed by SiLU. x: (B, T, C); weight: (C, 1, W)."""
    if _use_kernel(impl, HAS_CAUSAL_CONV1D, x, "causal-conv1d"):
        out = _causal_conv1d_fn(x.transpose(1, 2), weight.squeeze(1), bias, activation="silu")
        return out.transpose(1, 2)
    return causal_conv1d_ref(x, weight, bias)


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    W = weight.shape[-1]
    y = F.conv1d(x.transpose(1, 2), weight, bias, padding=W - 1, groups=x.shape[-1])
    return F.silu(y[..., : x.shape[1]]).transpose(1, 2)


def ssd(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    impl: str = "auto",
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
):
    """Mamba-2 state-space duality scan (no D skip, no gate; those live in the module).

    x: (b, l, h, p), dt: (b, l, h) after softplus, A: (h,) negative, B, C: (b, l, g, n).
    Per head:  state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T,  y_t = state_t C_t.
    Returns y (b, l, h, p) [and the final state (b, h, p, n)].
    """
    if _use_kernel(impl, HAS_MAMBA_SSM, x, "mamba_ssm"):
        out = _mamba_chunk_scan_combined(
            x, dt, A, B, C, chunk_size, initial_states=initial_state, return_final_states=return_final_state
        )
        return out
    from stateloop.models.ssd import ssd_chunked

    return ssd_chunked(x, dt, A, B, C, chunk_size, initial_state=initial_state, return_final_state=return_final_state)
