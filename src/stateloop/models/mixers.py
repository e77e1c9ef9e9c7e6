"""Token-axis mixers X_psi of eq. (3), S^{k+1} = X_psi(S~^{k+1}), acting on the updated state
S~^{k+1} of iteration k (one weight set shared by all iterations; the paper's notation,
models/looped.py):

    identity (eq. 7):   S^{k+1} = S~^{k+1}
    attention (eq. 8):  S^{k+1} = S~^{k+1} + Attn(RMSNorm_m(S~^{k+1}))      causal, RoPE, no FFN
    Mamba-2 (eq. 9):    S^{k+1} = S~^{k+1} + Mamba2(RMSNorm(S~^{k+1}))      SSD block along the tokens

The mixed state is the persistent state: it is what the reads see and what the next
iteration's update (eq. 6) starts from. It stays in float32 (models/state.py: the residual sum
S + Mixer(S) keeps the state's dtype); the mixer's own matmuls run in its weights' dtype. Every mixer has the contract
``forward(S (B, T, d_s), rope, cache) -> (B, T, d_s)``; ``cache`` is the per-iteration decoding
cache (a KV cache, or convolution + SSM states), or None for a full forward pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.backbone import Attention, RMSNorm, Rotary
from stateloop.models.cache import KVCache
from stateloop.models.fused import derived
from stateloop.models.kernels import (
    cast,
    causal_conv1d,
    causal_conv1d_ref,
    conv1d_step,
    gated_rms_norm,
    ssd,
    ssd_decode_step,
    upcast,
    wide_dtype,
)


class IdentityMixer(nn.Module):
    """Eq. (7): S^{k+1} = X_id(S~^{k+1}) = S~^{k+1}, StateLoop's mixer."""

    def forward(self, S: torch.Tensor, rope: Rotary, cache=None) -> torch.Tensor:
        return S  # (7)  S^{k+1} = S~^{k+1}

    def new_cache(self):
        return None


class AttentionMixer(nn.Module):
    """Eq. (8): pre-RMSNorm causal self-attention with RoPE over the state, residual, no FFN.
    Parameters: 4 d_s (h d_h) + d_s."""

    def __init__(self, d_s: int, n_heads: int, head_dim: int, eps: float = 1e-5, impl: str = "auto"):
        super().__init__()
        self.norm = RMSNorm(d_s, eps)
        self.attn = Attention(d_s, n_heads, head_dim, impl)

    def forward(self, S: torch.Tensor, rope: Rotary, cache: KVCache | None = None) -> torch.Tensor:
        u = cast(self.norm(S), self.attn.wq.weight.dtype)  # RMSNorm_m(S~^{k+1}); the products run in the weights' dtype
        return S + self.attn(u, rope.for_head_dim(self.attn.head_dim), cache)  # (8)  S^{k+1} = S~^{k+1} + CausalAttention(u)

    def new_cache(self) -> KVCache:
        return KVCache()


class GatedRMSNorm(nn.Module):
    """Mamba-2's output norm: RMSNorm(y * silu(z)) computed per group of d_in / n_groups channels
    (:func:`~stateloop.models.kernels.gated_rms_norm`)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5, impl: str = "auto"):
        super().__init__()
        self.group_size, self.eps, self.impl = group_size, eps, impl
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(y, z, self.weight, self.group_size, self.eps, self.impl)


class Mamba2Cache:
    """Decoding state of one Mamba-2 application: the last (d_conv - 1) convolution inputs and the
    SSM state (B, H, P, N)."""

    def __init__(self) -> None:
        self.conv: torch.Tensor | None = None
        self.ssm: torch.Tensor | None = None


class Mamba2(nn.Module):
    """Mamba-2 (SSD) block with the state-dict layout of ``mamba_ssm.modules.mamba2.Mamba2``:
    in_proj, conv1d, dt_bias, A_log, D, norm (gated, grouped), out_proj.

    in_proj maps d_model to [z (d_in), xBC (d_in + 2 G N), dt (H)]; xBC goes through a causal
    depthwise conv + SiLU and splits into x (H heads of P), B and C (G groups of N); then
    y = SSD(x, softplus(dt + dt_bias), -exp(A_log), B, C) + D x;  out = out_proj(norm(y, z)).
    Parameters: d(2 d_in + 2GN + H) + (d_in + 2GN)(d_conv + 1) + 3H + d_in + d_in d.
    ``ssm_state`` is N, the SSM state size per head (the config's ``model.mamba_d_state``), not
    the loop's persistent state width d_s.
    """

    def __init__(self, d_model: int, expand: int, ssm_state: int, d_conv: int, head_dim: int, n_groups: int,
                 chunk_size: int, eps: float = 1e-5, impl: str = "auto"):
        super().__init__()
        self.d_inner = expand * d_model
        if self.d_inner % head_dim:
            raise ValueError(f"Mamba-2: d_inner {self.d_inner} is not a multiple of head_dim {head_dim}")
        self.n_heads = self.d_inner // head_dim
        if self.n_heads % n_groups or self.d_inner % n_groups:
            raise ValueError(f"Mamba-2: {self.n_heads} heads cannot be split into {n_groups} groups")
        self.head_dim, self.ssm_state, self.n_groups, self.d_conv = head_dim, ssm_state, n_groups, d_conv
        self.chunk_size, self.impl = chunk_size, impl
        self.conv_dim = self.d_inner + 2 * n_groups * ssm_state
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * n_groups * ssm_state + self.n_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1, bias=True)
        self.dt_bias = nn.Parameter(torch.empty(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // n_groups, eps, impl)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)
        self.out_proj.residual_out = True

    def reset_parameters(self, std: float, dt_range=(1e-3, 1e-1), A_range=(1.0, 16.0)) -> None:
        """mamba_ssm's init: dt log-uniform in dt_range (stored through inverse softplus),
        A uniform in A_range, D = 1, conv PyTorch default."""
        nn.init.normal_(self.in_proj.weight, std=std)
        self.conv1d.reset_parameters()
        with torch.no_grad():
            lo, hi = dt_range
            dt = torch.exp(torch.rand(self.n_heads) * (math.log(hi) - math.log(lo)) + math.log(lo)).clamp(min=1e-4)
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
            self.A_log.copy_(torch.empty(self.n_heads).uniform_(*A_range).log())
            self.D.fill_(1.0)
        self.norm.weight.data.fill_(1.0)

    fused = False  # its fused inference form, A made once while A_log stays, switched on by stateloop/fast.py

    def _A(self) -> torch.Tensor:
        """A = -exp(A_log), in float32 at least."""
        if self.fused and not (torch.is_grad_enabled() and self.A_log.requires_grad):
            return derived(self, (self.A_log,), lambda: -torch.exp(upcast(self.A_log)))
        return -torch.exp(upcast(self.A_log))

    def _conv(self, xBC: torch.Tensor, cache: Mamba2Cache | None) -> torch.Tensor:
        if cache is None:
            return causal_conv1d(xBC, self.conv1d.weight, self.conv1d.bias, self.impl)
        W = self.d_conv
        hist = cache.conv if cache.conv is not None else xBC.new_zeros(xBC.shape[0], W - 1, xBC.shape[-1])
        cache.conv = torch.cat([hist, xBC], dim=1)[:, xBC.shape[1]:]  # the last W - 1 inputs
        return causal_conv1d_ref(xBC, self.conv1d.weight, self.conv1d.bias, history=hist)

    def forward(self, u: torch.Tensor, cache: Mamba2Cache | None = None) -> torch.Tensor:
        if cache is not None and u.shape[1] == 1:
            return self._decode_step(u, cache)
        Bsz, T, _ = u.shape
        G, N, H, P = self.n_groups, self.ssm_state, self.n_heads, self.head_dim
        z, xBC, dt = self.in_proj(u).split([self.d_inner, self.conv_dim, H], dim=-1)
        xBC = self._conv(xBC, cache)
        x, Bm, Cm = xBC.split([self.d_inner, G * N, G * N], dim=-1)
        x = x.view(Bsz, T, H, P)
        Bm, Cm = Bm.view(Bsz, T, G, N), Cm.view(Bsz, T, G, N)
        dt = F.softplus(dt + self.dt_bias)  # (B, T, H)
        A = self._A()  # (H,), fp32 at least
        if cache is None:
            y = ssd(x, dt, A, Bm, Cm, self.chunk_size, impl=self.impl)
        else:  # a chunk of several tokens continuing (or starting) a cached sequence
            y, final = ssd(x, dt, A, Bm, Cm, self.chunk_size, impl="torch",
                                   initial_state=cache.ssm, return_final_state=True)
            cache.ssm = final.to(wide_dtype(x.dtype)).contiguous()  # updated in place by steps
        y = y + self.D[:, None] * x
        y = self.norm(y.reshape(Bsz, T, self.d_inner), z)
        return self.out_proj(y)

    def _decode_step(self, u: torch.Tensor, cache: Mamba2Cache) -> torch.Tensor:
        """One new token (B, 1, d) through the cached convolution window and SSM state: the
        computation of :meth:`forward` for a single position (on CUDA through mamba_ssm's and
        causal-conv1d's decoding kernels, :mod:`stateloop.models.kernels`)."""
        Bsz = u.shape[0]
        G, N, H, P = self.n_groups, self.ssm_state, self.n_heads, self.head_dim
        z, xBC, dt = self.in_proj(u.view(Bsz, -1)).split([self.d_inner, self.conv_dim, H], dim=-1)
        if cache.conv is None:
            cache.conv = xBC.new_zeros(Bsz, self.d_conv - 1, self.conv_dim)
        xBC, cache.conv = conv1d_step(xBC, cache.conv, self.conv1d.weight.view(self.conv_dim, self.d_conv),
                                              self.conv1d.bias, self.impl)
        x, Bm, Cm = xBC.split([self.d_inner, G * N, G * N], dim=-1)
        if cache.ssm is None:
            cache.ssm = u.new_zeros(Bsz, H, P, N, dtype=wide_dtype(u.dtype))
        A = cast(self._A(), cache.ssm.dtype)
        y, cache.ssm = ssd_decode_step(cache.ssm, x.view(Bsz, H, P), dt, A, Bm.view(Bsz, G, N), Cm.view(Bsz, G, N),
                                        self.D, self.dt_bias, self.impl)
        y = self.norm(y.view(Bsz, 1, self.d_inner), z.unsqueeze(1))
        return self.out_proj(y)


class Mamba2Mixer(nn.Module):
    """Eq. (9): residual Mamba-2 block along the token axis, with an optional pre-RMSNorm."""

    def __init__(self, cfg):
        super().__init__()
        d_s = cfg.d_s
        self.norm = RMSNorm(d_s, cfg.norm_eps) if cfg.mamba_prenorm else nn.Identity()
        self.mamba = Mamba2(d_s, cfg.mamba_expand, cfg.mamba_d_state, cfg.mamba_d_conv, cfg.mamba_head_dim,
                            cfg.mamba_n_groups, cfg.mamba_chunk_size, cfg.norm_eps, cfg.ssd_impl)

    def forward(self, S: torch.Tensor, rope: Rotary, cache: Mamba2Cache | None = None) -> torch.Tensor:
        u = cast(self.norm(S), self.mamba.in_proj.weight.dtype)  # RMSNorm(S~^{k+1}) (cfg.mamba_prenorm), as in AttentionMixer
        return S + self.mamba(u, cache)  # (9)  S^{k+1} = Mamba2Block(S~^{k+1}), the block's residual written out

    def new_cache(self) -> Mamba2Cache:
        return Mamba2Cache()


def build_mixer(kind: str, cfg) -> nn.Module:
    """The mixer X_psi of eq. (3) named ``kind``, for the model shape ``cfg``: the mixers' registry
    (the state cells' is :func:`~stateloop.models.state.build_cell`)."""
    if kind == "identity":
        return IdentityMixer()
    if kind == "attn":
        return AttentionMixer(cfg.d_s, cfg.mixer_heads, cfg.mixer_head_dim, cfg.norm_eps, cfg.attn_impl)
    if kind == "mamba2":
        return Mamba2Mixer(cfg)
    raise ValueError(f"unknown mixer {kind!r} (identity, attn, mamba2)")
