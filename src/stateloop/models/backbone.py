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

import contextlib
import itertools
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.kernels import attention, qkv_fused, rms_norm


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain, through :func:`~stateloop.models.kernels.rms_norm`: one call instead of six Python-level
    operations (fused on CUDA). The norms are a large share of the per-token cost of batch-1
    decoding at small widths."""

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


class Rotary:
    """Positions and their RoPE angles for one forward pass (shared by every layer and iteration).

    :meth:`apply` rotates the pairs (i, i + D/2) of x (B, T, H, D) by the position angle, LLaMA's
    rotate-half convention: x cos + rotate_half(x) sin with rotate_half(x) = [-x2, x1]. It is
    computed as x cos + roll(x, D/2) [-sin1, sin2] (the sign moved onto the table: the same
    floats) in four operators instead of eight: it runs twice per attention application, and in
    batch-1 decoding the cost is per operator."""

    def __init__(self, T: int, offset: int, head_dim: int, theta: float, device, dtype):
        self.positions = torch.arange(offset, offset + T, device=device)
        self.head_dim = head_dim
        self.theta = theta
        self._tables(*rope_cos_sin(self.positions, head_dim, theta, dtype))

    def _tables(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        half = self.head_dim // 2
        self.cos, self.sin = cos, sin  # (T, D)
        self.cos_heads = cos[:, None, :]  # (T, 1, D): broadcast over the heads
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)[:, None, :]

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos_heads + x.roll(self.head_dim // 2, dims=-1) * self.sin_signed

    def for_head_dim(self, head_dim: int) -> Rotary:
        if head_dim == self.head_dim:
            return self
        r = Rotary.__new__(Rotary)
        r.positions, r.head_dim, r.theta = self.positions, head_dim, self.theta
        r._tables(*rope_cos_sin(self.positions, head_dim, self.theta, self.cos.dtype))
        return r


_PASS = threading.local()  # .id: the forward pass this thread is in (DerivedWeights.one_pass), 0 or unset outside one


class DerivedWeights(nn.Module):
    """A tensor made from some parameters (a concatenation, a transform), kept while none of them
    changes. With gradients it is remade at every call (it must be differentiable), and so it is
    for inference tensors (made in inference mode, they have no version to key on); otherwise it is
    remade only when a parameter changes in place. It is a submodule of the module whose
    parameters it derives from (it holds no parameters or buffers, so state dicts are unchanged),
    so moving or casting that module clears it: a new tensor may reuse a freed address at
    version 0.

    Inside one forward pass (:meth:`one_pass`, which ``LoopedLM.forward`` enters) no parameter
    changes, so the parameters are looked up only at the first call of the pass: a looped model
    asks for the same tensor K times per decoded token (every application of the backbone's
    attention, every iteration of the state cell), and the lookup, a few attribute reads per
    parameter, cost about as much as an operator inside a token (measured in
    benchmarks/records/2026-12-01-flops-state-branch-startup.md)."""

    _passes = itertools.count(1)

    def __init__(self) -> None:
        super().__init__()
        self.clear()

    def clear(self) -> None:
        self._key = self._value = None
        self._pass = 0  # the pass whose first call checked the key

    def _apply(self, fn, *args, **kwargs):
        self.clear()
        return super()._apply(fn, *args, **kwargs)

    @staticmethod
    def one_pass():
        """A forward pass in this thread: the parameters stay as they are until it ends. Under
        torch.compile it is no pass at all: a compiled forward makes the tensors inside its graphs,
        and the lookup's ``is_inference`` breaks a graph, which a generator's context may not hold."""
        if torch.compiler.is_compiling():
            return contextlib.nullcontext()
        return DerivedWeights._pass_context()

    @staticmethod
    @contextlib.contextmanager
    def _pass_context():
        outer = getattr(_PASS, "id", 0)
        _PASS.id = next(DerivedWeights._passes)
        try:
            yield
        finally:
            _PASS.id = outer

    @staticmethod
    def differentiable(params) -> bool:
        """Whether gradients flow to any of ``params()`` (a function giving the parameters: they
        are read only where needed, as reading a module's parameters is itself a cost per call)."""
        return torch.is_grad_enabled() and any(p.requires_grad for p in params())

    def get(self, params, make):
        """``make()``'s tensor, made from ``params()``."""
        # gradients are checked at every call: a pass may turn them off and on. A compiled forward
        # makes the tensor inside its graph (and is_inference, below, would break the graph)
        if self.differentiable(params) or torch.compiler.is_compiling():
            return make()
        current = getattr(_PASS, "id", 0)
        if current and self._pass == current:
            return self._value
        params = params()
        if any(p.is_inference() for p in params):
            return make()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if self._key != key:
            self._key, self._value = key, make()
        self._pass = current
        return self._value


class Attention(nn.Module):
    """Causal self-attention with RoPE; optional KV cache for incremental decoding.

    With gradients (training) q, k and v are three products, q = RoPE(x W_q^T), k = RoPE(x W_k^T),
    v = x W_v^T. Without (decoding, evaluation) they come from their twin
    :func:`~stateloop.models.kernels.qkv_fused`, one product with [W_q; W_k; W_v], which is kept
    while the weights stay: one operator instead of three per application, at the cost of a copy
    of the three matrices in memory beside them ([choice]; training's numbers are the three
    products'; the twin's agree to the dtype's rounding, tests/models/test_decode_parts.py)."""

    def __init__(self, d_in: int, n_heads: int, head_dim: int, impl: str = "auto"):
        super().__init__()
        self.n_heads, self.head_dim, self.impl = n_heads, head_dim, impl
        inner = n_heads * head_dim
        self.wq = nn.Linear(d_in, inner, bias=False)
        self.wk = nn.Linear(d_in, inner, bias=False)
        self.wv = nn.Linear(d_in, inner, bias=False)
        self.wo = nn.Linear(inner, d_in, bias=False)
        self.wo.residual_out = True  # init: scaled by the unrolled depth (models/init.py)
        self._qkv = DerivedWeights()

    def forward(self, x: torch.Tensor, rope: Rotary, kv_cache=None) -> torch.Tensor:
        B, T, _ = x.shape
        H, D = self.n_heads, self.head_dim
        if not DerivedWeights.differentiable(self._qkv_weights):  # decoding, evaluation: the fused twin
            q, k, v = qkv_fused(x, self._qkv.get(self._qkv_weights, lambda: torch.cat(self._qkv_weights())), rope, H, D)
        else:  # the weights on F.linear, not calls of their modules (the mixer's attention sits outside the layers)
            q = rope.apply(F.linear(x, self.wq.weight).view(B, T, H, D))  # RoPE(x W_q^T)
            k = rope.apply(F.linear(x, self.wk.weight).view(B, T, H, D))  # RoPE(x W_k^T)
            v = F.linear(x, self.wv.weight).view(B, T, H, D)  # x W_v^T
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, T_past + T, H, D)
        y = attention(q, k, v, impl=self.impl)  # (B, T, H, D): softmax(q k^T / sqrt(D), causal) v
        return self.wo(y.reshape(B, T, -1))

    def _qkv_weights(self):
        return self.wq.weight, self.wk.weight, self.wv.weight


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
        return cls(
            cfg.n_layers if n_layers is None else n_layers,
            cfg.d_model,
            cfg.d_ff if d_ff is None else d_ff,
            cfg.n_heads,
            cfg.head_dim,
            cfg.norm_eps,
            cfg.attn_impl,
        )
