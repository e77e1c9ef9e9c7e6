"""The LLaMA-style backbone T shared by every model.

Design choices (paper, Sec. 3 and setup):
- pre-RMSNorm decoder layers, no biases anywhere;
- rotary position embeddings (RoPE) on queries and keys, rotate-half convention as in LLaMA;
  in looped models the positions are the token positions, the same in every iteration;
- causal multi-head attention through :func:`stateloop.models.kernels.attention`
  (flash-attn on CUDA when importable, else ``scaled_dot_product_attention``);
- SwiGLU feed-forward ``W_down(silu(W_gate n) * W_up n)``;
- params per layer = 4 d^2 (attention, h * head_dim = d) + 3 d f (SwiGLU) + 2 d (two norms).

Shapes: B batch, T tokens, d model width, H heads, D head dim.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.fused import attention_twin, takes_twin
from stateloop.models.kernels import attention, rms_norm


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain: x / sqrt(mean(x^2) + eps) * weight (:func:`~stateloop.models.kernels.rms_norm`)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos, sin of shape (T, head_dim) for the given integer positions (T,)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension (halves of D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Rotary:
    """Positions and their RoPE angles for one forward pass (shared by every layer and iteration).
    :meth:`apply` rotates x (B, T, H, D): x cos + rotate_half(x) sin (LLaMA's convention)."""

    def __init__(self, T: int, offset: int, head_dim: int, theta: float, device, dtype):
        self.positions = torch.arange(offset, offset + T, device=device)
        self.T, self.offset, self.head_dim, self.theta = T, offset, head_dim, theta
        self.cos, self.sin = rope_cos_sin(self.positions, head_dim, theta, dtype)  # (T, D)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = self.cos[:, None], self.sin[:, None]  # (T, 1, D): broadcast over the heads
        return x * cos + rotate_half(x) * sin

    def for_head_dim(self, head_dim: int) -> Rotary:
        if head_dim == self.head_dim:
            return self
        return Rotary(self.T, self.offset, head_dim, self.theta, self.positions.device, self.cos.dtype)


class Attention(nn.Module):
    """Causal self-attention with RoPE; optional KV cache for incremental decoding:
    q = RoPE(x W_q^T), k = RoPE(x W_k^T), v = x W_v^T, y = softmax(q k^T / sqrt(D), causal) v W_o^T."""

    def __init__(self, d_in: int, n_heads: int, head_dim: int, impl: str = "auto"):
        super().__init__()
        self.n_heads, self.head_dim, self.impl = n_heads, head_dim, impl
        inner = n_heads * head_dim
        self.wq = nn.Linear(d_in, inner, bias=False)
        self.wk = nn.Linear(d_in, inner, bias=False)
        self.wv = nn.Linear(d_in, inner, bias=False)
        self.wo = nn.Linear(inner, d_in, bias=False)
        self.wo.residual_out = True  # init: scaled by the unrolled depth (models/init.py)

    fused = False  # its fused inference form, models/fused.attention_twin, switched on by stateloop/fast.py

    def forward(self, x: torch.Tensor, rope: Rotary, kv_cache=None) -> torch.Tensor:
        if takes_twin(self):
            return attention_twin(self, x, rope, kv_cache)
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        q = rope.apply(self.wq(x).view(B, T, H, D))
        k = rope.apply(self.wk(x).view(B, T, H, D))
        v = self.wv(x).view(B, T, H, D)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, T_past + T, H, D)
        y = attention(q, k, v, impl=self.impl)  # (B, T, H, D)
        return self.wo(y.reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, d: int, f: int):
        super().__init__()
        self.w_gate = nn.Linear(d, f, bias=False)
        self.w_up = nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)
        self.w_down.residual_out = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Layer(nn.Module):
    """x <- x + Attn(RMSNorm(x));  x <- x + SwiGLU(RMSNorm(x))."""

    def __init__(self, d: int, f: int, n_heads: int, head_dim: int, eps: float, attn_impl: str = "auto"):
        super().__init__()
        self.attn_norm = RMSNorm(d, eps)
        self.attn = Attention(d, n_heads, head_dim, attn_impl)
        self.ffn_norm = RMSNorm(d, eps)
        self.ffn = SwiGLU(d, f)

    def forward(self, x: torch.Tensor, rope: Rotary, kv_cache=None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, kv_cache)
        return x + self.ffn(self.ffn_norm(x))


class Backbone(nn.Module):
    """T: a stack of layers. ``caches`` is a list with one KV cache per layer (or None)."""

    def __init__(self, n_layers: int, d: int, f: int, n_heads: int, head_dim: int, eps: float, attn_impl: str = "auto"):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, f, n_heads, head_dim, eps, attn_impl) for _ in range(n_layers))

    def forward(self, x: torch.Tensor, rope: Rotary, caches=None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, None if caches is None else caches[i])
        return x

    @classmethod
    def from_config(cls, cfg, n_layers: int | None = None, d_ff: int | None = None) -> Backbone:
        return cls(cfg.n_layers if n_layers is None else n_layers, cfg.d_model, cfg.d_ff if d_ff is None else d_ff,
                   cfg.n_heads, cfg.head_dim, cfg.norm_eps, cfg.attn_impl)
