"""Pure-PyTorch Mamba-2 SSD (state-space duality), chunked, and its sequential definition.

Notation (Dao & Gu 2024): b batch, l length, h heads, p head dim, g groups, n state size,
c chunks, q chunk length, r = h / g heads per group. Head i uses group i // r for B and C. The recurrence is

    H_t = exp(dt_t * A) * H_{t-1} + dt_t * x_t B_t^T        H_t in R^{p x n}
    y_t = H_t C_t

:func:`ssd_sequential` computes it step by step (the definition; also the decoding step).
:func:`ssd_chunked` computes the same thing in O(l q) work per head with matmuls: exact
attention-like mixing inside each chunk, a short recurrence over chunk-final states between
chunks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _expand_groups(t: torch.Tensor, h: int) -> torch.Tensor:
    """(b, l, g, n) -> (b, l, h, n): each group serves h / g consecutive heads."""
    g = t.shape[2]
    return t.repeat_interleave(h // g, dim=2)


def ssd_chunked(x, dt, A, B, C, chunk_size: int, initial_state=None, return_final_state: bool = False):
    """Chunked SSD. Shapes as in :func:`stateloop.models.kernels.ssd`.

    Computed in the promoted dtype of x and A (A is float32 at least, so bfloat16 inputs run in
    float32, as the fused kernel accumulates); y is returned in x's dtype.

    Written for a CPU, where every pass over memory and every copy costs as much as the small
    batched products (measured in
    benchmarks/records/2026-12-01-flops-state-branch-startup.md): the tensors stay in the
    token-major layout the module hands over, (b, l, h, p)
    and (b, l, g, n), so that the products with B and C run once per group over its r heads side
    by side (B and C are never copied to each head), and
    a chunk's state is kept transposed, (n, r p) per group, which is the layout both of its
    products give and take without a copy. The log-decay from step j to step i of a chunk is
    a_cum[i] - a_cum[j] of one cumulative sum, masked above the diagonal before the exponential
    (as the fused kernel computes it), and the states are carried across chunks by c - 1
    elementwise steps, which models/flops.py does not count as matmul FLOPs.
    """
    out_dtype = x.dtype
    cdt = torch.promote_types(x.dtype, A.dtype)
    x, dt, B, C = (t.to(cdt) for t in (x, dt, B, C))
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    r, q = h // g, chunk_size  # heads per group: head i = group i // r, its index in the group i % r
    pad = (-l) % q
    if pad:  # padded steps have dt = 0: no decay, no input, so states and outputs are unchanged
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    L = x.shape[1]
    c = L // q
    xdt = (x * dt.unsqueeze(-1)).view(b, c, q, g, r, p)  # dt_t x_t
    a_cum = (dt * A).view(b, c, q, h).cumsum(2)  # (b, c, q, h): log-decay from a chunk's start to step i
    B, C = B.view(b, c, q, g, n), C.view(b, c, q, g, n)

    # 1. Within each chunk: y_i = sum_{j <= i} (C_i . B_j) exp(a_cum_i - a_cum_j) dt_j x_j
    a_h = a_cum.transpose(2, 3)  # (b, c, h, q)
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp((a_h.unsqueeze(-1) - a_h.unsqueeze(-2)).masked_fill(~causal, float("-inf")))  # (b, c, h, q, q)
    scores = torch.einsum("bcign,bcjgn->bcgij", C, B).unsqueeze(3) * decay.view(b, c, g, r, q, q)  # C_i . B_j once per group
    y = torch.einsum("bcgrij,bcjgrp->bcigrp", scores, xdt).reshape(b, c, q, h, p)

    # 2. The state each chunk alone leaves at its last step, transposed: B^T (exp(a_cum_last - a_cum_j) dt_j x_j)
    to_end = torch.exp(a_cum[:, :, -1:] - a_cum)  # (b, c, q, h)
    xw = (xdt.view(b, c, q, h, p) * to_end.unsqueeze(-1)).view(b, c, q, g, r * p)
    own = torch.einsum("bcjgn,bcjgm->bcgnm", B, xw).view(b, c, g, n, r, p)

    # 3. Carry across chunks: S_k = exp(a_cum of chunk k's last step) S_{k-1} + own_k.
    chunk_decay = torch.exp(a_cum[:, :, -1]).view(b, c, g, 1, r, 1)  # broadcast over (n, r, p)
    S = None if initial_state is None else initial_state.to(cdt).view(b, g, r, p, n).permute(0, 1, 4, 2, 3)
    entering = []  # the state entering each chunk, (b, g, n, r, p)
    for own_k, decay_k in zip(own.unbind(1), chunk_decay.unbind(1)):  # unbind: one backward for all chunks, not c
        entering.append(S)
        S = own_k if S is None else torch.addcmul(own_k, S, decay_k)

    # 4. Each output reads the state entering its chunk, decayed to its step: exp(a_cum_i) C_i . S
    if c > 1 or (c == 1 and initial_state is not None):
        if entering[0] is None:
            entering[0] = torch.zeros_like(S)
        prev = torch.stack(entering, 1).view(b, c, g, n, r * p)
        y_in = torch.einsum("bcign,bcgnm->bcigm", C, prev).reshape(b, c, q, h, p)
        y = torch.addcmul(y, y_in, torch.exp(a_cum).unsqueeze(-1))

    y = y.reshape(b, L, h, p)[:, :l].to(out_dtype)
    if not return_final_state:
        return y
    if S is None:  # an empty sequence and no entering state
        return y, x.new_zeros(b, h, p, n)
    return y, S.permute(0, 1, 3, 4, 2).reshape(b, h, p, n)  # (b, g, n, r, p) -> (b, h, p, n)


def ssd_sequential(x, dt, A, B, C, initial_state=None, return_final_state: bool = False):
    """The recurrence, one step at a time (reference and decoding)."""
    b, l, h, p = x.shape
    n = B.shape[-1]
    B, C = _expand_groups(B, h), _expand_groups(C, h)
    state = torch.zeros(b, h, p, n, dtype=x.dtype, device=x.device) if initial_state is None else initial_state
    ys = []
    for t in range(l):
        state, y = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t])
        ys.append(y)
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(b, 0, h, p)
    return (y, state) if return_final_state else y


def ssd_step(state, x, dt, A, B, C):
    """One step. state (b, h, p, n), x (b, h, p), dt (b, h), B, C (b, h, n) -> (state, y (b, h, p))."""
    decay = torch.exp(dt * A)[..., None, None]  # (b, h, 1, 1)
    state = decay * state + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", state, C)
    return state, y
