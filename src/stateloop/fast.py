"""Fused inference forms of the model code, applied to a built model from outside by
:func:`accelerate` (models/ holds the paper's printed forms and never imports this module). They run
only without gradients (decoding, evaluation, analyses), where a looped model applies them K times
per token and at batch 1 the cost is per operator (benchmarks/records/2026-12-04-decode-python-cuts.md):

- :func:`qkv_fused`: q, k, v from one product with [W_q; W_k; W_v], RoPE once on q and k together
  (:func:`rotate`, RoPE's floats in fewer operators);
- :func:`selective_state_step`: eqs. (2), (5), (6) with one product with [W_u; W_Delta] (bias
  [0; b_Delta]), -lambda made once, eq. (6) as ``lerp`` (``addcmul`` at S = 0);
- Mamba-2's A = -exp(A_log), made once.

Their floats agree with the printed forms to the dtype's rounding, not bit for bit (tolerances in
tests/models/test_decode_parts.py, tests/models/test_state_equations.py). The concatenated weights
are kept while the parameters stay (:class:`Derived`).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from stateloop.models.backbone import Attention
from stateloop.models.kernels import attention, cast, rms_norm, upcast
from stateloop.models.mixers import Mamba2
from stateloop.models.state import SelectiveStateCell


class Derived:
    """A tensor made from some parameters, kept while none of them moves or changes in place."""

    def __init__(self, params, make) -> None:
        self.params, self.make, self.key, self.value = params, make, None, None

    def get(self):
        params = self.params()
        if any(p.is_inference() for p in params):  # no version counter to key on
            return self.make()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if key != self.key:
            self.key, self.value = key, self.make()
        return self.value


def differentiable(module: torch.nn.Module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def rotate(rope, x: torch.Tensor) -> torch.Tensor:
    """``rope.apply(x)`` as x cos + roll(x, D/2) [-sin_1, sin_2]: the same floats (the sign of
    rotate_half moved onto the table) in four operators instead of nine; the tables are made once per
    forward pass, on the pass's ``Rotary``."""
    tables = vars(rope).get("_fast_tables")
    if tables is None:
        half = rope.head_dim // 2
        tables = rope._fast_tables = (rope.cos[:, None], torch.cat([-rope.sin[:, :half], rope.sin[:, half:]], -1)[:, None])
    return x * tables[0] + x.roll(rope.head_dim // 2, dims=-1) * tables[1]


def qkv_fused(x: torch.Tensor, W_qkv: torch.Tensor, rope, n_heads: int, head_dim: int):
    """q, k, v (B, T, n_heads, head_dim) of ``backbone.Attention`` for x (B, T, d_in), from one product
    with W_qkv = [W_q; W_k; W_v] and one RoPE on q and k side by side."""
    B, T, _ = x.shape
    H = n_heads
    qkv = F.linear(x, W_qkv).view(B, T, 3 * H, head_dim)
    qk = rotate(rope, qkv[:, :, : 2 * H])
    return qk[:, :, :H], qk[:, :, H:], qkv[:, :, 2 * H :]


def attention_forward(self: Attention, x: torch.Tensor, rope, kv_cache=None) -> torch.Tensor:
    if differentiable(self):
        return Attention.forward(self, x, rope, kv_cache)
    B, T, _ = x.shape
    q, k, v = qkv_fused(x, self._fast_qkv.get(), rope, self.n_heads, self.head_dim)
    if kv_cache is not None:
        k, v = kv_cache.update(k, v)
    return self.wo(attention(q, k, v, impl=self.impl).reshape(B, T, -1))


def selective_state_step(S: torch.Tensor | None, H: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                         W: torch.Tensor, b: torch.Tensor, neg_lambda: torch.Tensor) -> torch.Tensor:
    """``SelectiveStateCell.forward`` (eqs. 2, 5, 6) on W = [W_u; W_Delta], b = [0; b_Delta] and
    neg_lambda = -exp(A_log); S = None is S^k = 0."""
    U = rms_norm(H, norm_weight, eps)                              # (2)
    P, pre = upcast(F.linear(U, W, b)).chunk(2, dim=-1)            # (5), and (6)'s pre-activation
    g = torch.exp(F.softplus(pre) * neg_lambda)                    # (6)
    if S is None:
        return torch.addcmul(P, g, P, value=-1.0)                  # (1 - g) P = P - g P
    return torch.lerp(P, cast(S, P.dtype), g)                      # g S + (1 - g) P = P + g (S - P)


def cell_forward(self: SelectiveStateCell, S: torch.Tensor | None, H: torch.Tensor) -> torch.Tensor:
    if differentiable(self):
        return SelectiveStateCell.forward(self, S, H)
    return selective_state_step(S, H, self.norm_h.weight, self.norm_h.eps, *self._fast_weights.get())


def cell_weights(cell: SelectiveStateCell):
    b = torch.cat([torch.zeros_like(cell.b_delta), cell.b_delta])
    return torch.cat([cell.W_u.weight, cell.W_delta.weight]), b, -torch.exp(upcast(cell.A_log))


def mamba2_A(self: Mamba2) -> torch.Tensor:
    if torch.is_grad_enabled() and self.A_log.requires_grad:
        return Mamba2._A(self)
    return self._fast_A.get()


def accelerate(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its attentions, eq. (6) cells and Mamba-2 mixers taking the fused forms without gradients (in
    place, idempotent; the parameters and state dict are unchanged). Returns the model."""
    for m in model.modules():
        if isinstance(m, Attention) and "_fast_qkv" not in vars(m):
            m._fast_qkv = Derived(lambda m=m: (m.wq.weight, m.wk.weight, m.wv.weight),
                                  lambda m=m: torch.cat([m.wq.weight, m.wk.weight, m.wv.weight]))
            m.forward = types.MethodType(attention_forward, m)
        elif isinstance(m, SelectiveStateCell) and "_fast_weights" not in vars(m):
            m._fast_weights = Derived(lambda m=m: (m.W_u.weight, m.W_delta.weight, m.b_delta, m.A_log),
                                      lambda m=m: cell_weights(m))
            m.forward = types.MethodType(cell_forward, m)
        elif isinstance(m, Mamba2) and "_fast_A" not in vars(m):
            m._fast_A = Derived(lambda m=m: (m.A_log,), lambda m=m: Mamba2._A(m))
            m._A = types.MethodType(mamba2_A, m)
    return model
