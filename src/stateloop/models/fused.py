"""The fused inference forms: twins of printed forms that do the same map in fewer operators, for
forwards without gradients (decoding, evaluation, analyses), where a looped model applies them K
times per token and at batch 1 the cost is per operator (benchmarks/records/2026-12-04-decode-python-cuts.md).

A module class with a twin declares it with a class attribute ``fused = False`` and one line at the
top of its printed form that hands over to the twin while ``fused`` is on and no gradient is taken;
stateloop/fast.py switches ``fused`` on and off for a whole model. The twins:

- :func:`attention_twin`: q, k, v from one product with [W_q; W_k; W_v], RoPE once on q and k together
  (:func:`rotate`, RoPE's floats in fewer operators);
- :func:`selective_state_twin`: eqs. (2), (5), (6) with one product with [W_u; W_Delta] (bias
  [0; b_Delta]), -lambda made once, eq. (6) as ``lerp`` (``addcmul`` at S = 0);
- Mamba-2's A = -exp(A_log), made once (``Mamba2._A``).

Their floats agree with the printed forms to the dtype's rounding, not bit for bit (tolerances in
tests/models/test_decode_parts.py, tests/models/test_state_equations.py). A concatenated weight is
kept while its parameters stay (:class:`Derived`, an ordinary attribute of the module: a copy or a
pickle of the module starts without it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from stateloop.models.kernels import attention as attention_kernel
from stateloop.models.kernels import cast, rms_norm, upcast


class Derived:
    """A tensor made from some parameters, kept while none of them moves or changes in place. Holds
    no reference to its module: a deep copy or a pickle starts empty (the copy's parameters are others)."""

    def __init__(self) -> None:
        self.key, self.value = None, None

    def get(self, params: tuple, make):
        if any(p.is_inference() for p in params):  # no version counter to key on
            return make()
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in params)
        if key != self.key:
            self.key, self.value = key, make()
        return self.value

    def __getstate__(self) -> dict:
        return {"key": None, "value": None}


def derived(module, params: tuple, make):
    """The tensor ``make()`` from ``params``, kept on ``module`` while they stay (:class:`Derived`)."""
    return vars(module).setdefault("_fused_derived", Derived()).get(params, make)


def differentiable(module: torch.nn.Module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def takes_twin(module: torch.nn.Module) -> bool:
    """Whether ``module`` takes its fused twin now: switched on (fast.accelerate) and no gradient taken."""
    return module.fused and not differentiable(module)


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


def attention_twin(att, x: torch.Tensor, rope, kv_cache=None) -> torch.Tensor:
    """``backbone.Attention.forward``'s twin."""
    B, T, _ = x.shape
    W = derived(att, (att.wq.weight, att.wk.weight, att.wv.weight), lambda: torch.cat([att.wq.weight, att.wk.weight, att.wv.weight]))
    q, k, v = qkv_fused(x, W, rope, att.n_heads, att.head_dim)
    if kv_cache is not None:
        k, v = kv_cache.update(k, v)
    return att.wo(attention_kernel(q, k, v, impl=att.impl).reshape(B, T, -1))


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


def cell_weights(cell):
    """[W_u; W_Delta], [0; b_Delta] and -lambda = -exp(A_log) of a ``SelectiveStateCell``."""
    b = torch.cat([torch.zeros_like(cell.b_delta), cell.b_delta])
    return torch.cat([cell.W_u.weight, cell.W_delta.weight]), b, -torch.exp(upcast(cell.A_log))


def selective_state_twin(cell, S: torch.Tensor | None, H: torch.Tensor) -> torch.Tensor:
    """``state.SelectiveStateCell.forward``'s twin."""
    weights = derived(cell, (cell.W_u.weight, cell.W_delta.weight, cell.b_delta, cell.A_log), lambda: cell_weights(cell))
    return selective_state_step(S, H, cell.norm_h.weight, cell.norm_h.eps, *weights)
