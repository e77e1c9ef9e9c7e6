"""The only module that imports fused CUDA kernels (flash-attn, mamba_ssm, causal-conv1d); each has
a pure-PyTorch twin. ``impl``: ``"auto"`` (the kernel on CUDA when it imports), ``"torch"`` or
``"kernel"`` (required); tests/models/test_kernels_gpu.py compares both on a GPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stateloop.models.ssd import ssd_chunked


def _optional(*names: str) -> list:
    """The functions ``package.module.function`` of an optional CUDA package: all of them, or Nones
    where one does not import (no package, or a build without its CUDA extension)."""
    try:  # pragma: no cover - only on GPU machines
        import importlib  # inside the try: transformers' remote-code check of an export reads no import there

        return [getattr(importlib.import_module(m), f) for m, _, f in (n.rpartition(".") for n in names)]
    except Exception:  # noqa: BLE001
        return [None] * len(names)


(_flash_attn_func,) = _optional("flash_attn.flash_attn_func")
(_mamba_chunk_scan_combined,) = _optional("mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined")
_rmsnorm_gated_fn, _selective_state_update = _optional(
    "mamba_ssm.ops.triton.layernorm_gated.rmsnorm_fn", "mamba_ssm.ops.triton.selective_state_update.selective_state_update")
_causal_conv1d_fn, _causal_conv1d_update = _optional("causal_conv1d.causal_conv1d_fn", "causal_conv1d.causal_conv1d_update")
HAS_FLASH_ATTN, HAS_MAMBA_SSM = _flash_attn_func is not None, _mamba_chunk_scan_combined is not None
HAS_MAMBA_DECODE, HAS_CAUSAL_CONV1D = _rmsnorm_gated_fn is not None, _causal_conv1d_fn is not None


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
# Precision


def wide_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 in a float64 run (any of ``dtypes``), else float32: where precision-critical values
    (normalisation statistics, gates, recurrent states) are computed and kept."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in ``dtype`` (x itself when it already is)."""
    return x if x.dtype == dtype else x.to(dtype)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in :func:`wide_dtype` (``x.float()`` would downcast a float64 verification run)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.to(wide_dtype(x.dtype))


# ----------------------------------------------------------------------------------------------
# RMSNorm


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, in the wider dtype of x and weight."""
    if weight is not None and weight.dtype != x.dtype:
        dtype = torch.promote_types(x.dtype, weight.dtype)
        x, weight = cast(x, dtype), cast(weight, dtype)
    return F.rms_norm(x, x.shape[-1:], weight, eps)


# ----------------------------------------------------------------------------------------------
# Causal attention


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """Causal multi-head attention. q: (B, Tq, H, D); k, v: (B, Tk, H, D), Tk >= Tq; the queries
    are the *last* Tq positions: query i attends to keys j <= Tk - Tq + i."""
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


def causal_conv1d_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      history: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-PyTorch twin of :func:`causal_conv1d` (W shifted multiply-adds); ``history`` (B, W-1, C):
    the inputs before x, zeros when None."""
    W = weight.shape[-1]
    full = F.pad(x, (0, 0, W - 1, 0)) if history is None else torch.cat([history.to(x.dtype), x], dim=1)
    T, w = x.shape[1], weight.view(-1, W)
    y = full[:, :T] * w[:, 0] if bias is None else torch.addcmul(bias, full[:, :T], w[:, 0])
    for k in range(1, W):  # tap k reads input t - (W - 1 - k)
        y = torch.addcmul(y, full[:, k:k + T], w[:, k])
    return F.silu(y)


def ssd(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk_size: int,
        impl: str = "auto", initial_state: torch.Tensor | None = None, return_final_state: bool = False):
    """Mamba-2 state-space duality scan (no D skip, no gate). x: (b, l, h, p), dt: (b, l, h) after
    softplus, A: (h,) negative, B, C: (b, l, g, n). Per head: state_t = exp(dt_t A) state_{t-1} +
    dt_t x_t B_t^T, y_t = state_t C_t. Returns y (b, l, h, p) [and the final state (b, h, p, n)]."""
    if _use_kernel(impl, HAS_MAMBA_SSM, x, "mamba_ssm"):
        return _mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, initial_states=initial_state,
                                          return_final_states=return_final_state)
    return ssd_chunked(x, dt, A, B, C, chunk_size, initial_state=initial_state, return_final_state=return_final_state)


# ----------------------------------------------------------------------------------------------
# Mamba-2 single-token decoding: convolution window, SSM recurrence, gated RMSNorm


def conv1d_step(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                impl: str = "auto"):
    """One new input x (B, C) through a depthwise causal convolution + SiLU; conv_state (B, W-1, C):
    the previous inputs; weight: (C, W). Returns (y (B, C), the new state: the kernel's in place)."""
    if _use_kernel(impl, HAS_CAUSAL_CONV1D, x, "causal-conv1d"):
        conv_state = conv_state.contiguous()  # the kernel writes into it: (B, C, W-1) with channels contiguous
        return _causal_conv1d_update(x, conv_state.transpose(1, 2), weight, bias, "silu"), conv_state
    return conv1d_step_ref(x, conv_state, weight, bias)


def conv1d_step_ref(x, conv_state, weight, bias):
    window = torch.cat([conv_state, x.unsqueeze(1)], dim=1)  # (B, W, C): inputs t-W+1 .. t
    y = torch.linalg.vecdot(window, weight.t(), dim=1)  # sum_w window[w] * weight[:, w]
    return F.silu(y if bias is None else y + bias), window[:, 1:]


def ssd_decode_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor, impl: str = "auto"):
    """One token of the SSD recurrence, the state updated in place: dt <- softplus(dt + dt_bias);
    H <- exp(dt A) H + (dt x) B^T; y = H C + D x. state: (b, h, p, n); x: (b, h, p); dt: (b, h);
    A, D, dt_bias: (h,); B, C: (b, g, n). Returns (y in x's dtype, state)."""
    b, h, p = x.shape
    n = state.shape[-1]
    if _use_kernel(impl, HAS_MAMBA_DECODE, x, "mamba_ssm selective_state_update"):
        # The kernel takes per-channel dt, A, D and dt_bias; stride-0 expansions tell it they are per head.
        y = _selective_state_update(state, x, dt.unsqueeze(-1).expand(b, h, p), A.float()[:, None, None].expand(h, p, n),
                                    B, C, D[:, None].expand(h, p), z=None, dt_bias=dt_bias[:, None].expand(h, p),
                                    dt_softplus=True)
        return y, state
    return ssd_decode_step_ref(state, x, dt, A, B, C, D, dt_bias)


def ssd_decode_step_ref(state, x, dt, A, B, C, D, dt_bias):
    """Pure-PyTorch twin of :func:`ssd_decode_step`: heads viewed as (groups, heads per group x head
    dim), so the outer product and the readout are one batched matrix product each."""
    b, h, p = x.shape
    g, n = B.shape[1], B.shape[2]
    sdt = state.dtype
    dt = F.softplus(cast(dt, sdt) + dt_bias)  # (b, h)
    state.mul_(torch.exp(dt * cast(A, sdt)).view(b, h, 1, 1))  # exp(dt A) H
    flat = state.view(b * g, h // g * p, n)
    xs = cast(x, sdt)
    flat.baddbmm_((xs * dt.unsqueeze(-1)).view(b * g, -1, 1), cast(B, sdt).reshape(b * g, 1, n))  # + (dt x) B^T
    y = torch.bmm(flat, cast(C, sdt).reshape(b * g, n, 1)).view(b, h, p)  # H C
    return cast(torch.addcmul(y, D.view(h, 1), xs), x.dtype), state  # + D x


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                   impl: str = "auto") -> torch.Tensor:
    """Mamba-2's output norm, RMSNorm(y * SiLU(z)) over groups of ``group_size`` channels, times
    ``weight``. Kernel: mamba_ssm's gated RMSNorm (``norm_before_gate=False``)."""
    if _use_kernel(impl, HAS_MAMBA_DECODE, y, "mamba_ssm gated RMSNorm"):
        return _rmsnorm_gated_fn(y, weight, None, z=z, eps=eps, group_size=group_size, norm_before_gate=False)
    return gated_rms_norm_ref(y, z, weight, group_size, eps)


def gated_rms_norm_ref(y, z, weight, group_size, eps):
    """The twin of the kernel: y and z upcast *before* the gate y * SiLU(z), as mamba_ssm's
    ``rms_norm_ref`` does; the result in y's dtype."""
    out_dtype = y.dtype
    dtype = wide_dtype(y.dtype, weight.dtype)
    y = cast(y, dtype) * F.silu(cast(z, dtype))
    if group_size == y.shape[-1]:  # one group
        return cast(rms_norm(y, weight, eps), out_dtype)
    g = rms_norm(y.view(*y.shape[:-1], -1, group_size), None, eps)
    return cast(weight * g.view_as(y), out_dtype)
