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


def segsum(a: torch.Tensor) -> torch.Tensor:
    """a (..., q) -> (..., q, q) with out[i, j] = a[j+1] + ... + a[i] for i >= j, -inf above.

    exp(segsum(a)) is the lower-triangular matrix of decays from position j to position i.
    Computed from masked cumulative sums (not differences of one cumsum) to stay exact.
    """
    q = a.shape[-1]
    rep = a.unsqueeze(-1).expand(*a.shape, q)  # rep[..., i, j] = a[i]
    strict = torch.ones(q, q, dtype=torch.bool, device=a.device).tril(-1)
    rep = rep.masked_fill(~strict, 0.0)  # keep a[i] only where i > j
    out = rep.cumsum(dim=-2)  # out[..., i, j] = sum_{j < k <= i} a[k]
    keep = torch.ones(q, q, dtype=torch.bool, device=a.device).tril()
    return out.masked_fill(~keep, float("-inf"))


def ssd_chunked(x, dt, A, B, C, chunk_size: int, initial_state=None, return_final_state: bool = False):
    """Chunked SSD. Shapes as in :func:`stateloop.models.kernels.ssd`.

    Computed in the promoted dtype of x and A (A is float32 at least, so bfloat16 inputs run in
    float32, as the fused kernel accumulates); y is returned in x's dtype."""
    out_dtype = x.dtype
    cdt = torch.promote_types(x.dtype, A.dtype)
    x, dt, B, C = (t.to(cdt) for t in (x, dt, B, C))
    if initial_state is not None:
        initial_state = initial_state.to(cdt)
    b, l, h, p = x.shape
    n = B.shape[-1]
    q = chunk_size
    pad = (-l) % q
    if pad:  # padded steps have dt = 0: no decay, no input, so states and outputs are unchanged
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    g = B.shape[2]
    r = h // g  # heads per group: head i = group i // r, its index in the group i % r
    L = x.shape[1]
    c = L // q
    xdt = (x * dt.unsqueeze(-1)).reshape(b, c, q, g, r, p)  # dt_t x_t
    B = B.reshape(b, c, q, g, n)  # B and C stay per group: every product with them is taken once per
    C = C.reshape(b, c, q, g, n)  # group and broadcast over its r heads, never copied to each head
    a = (dt * A).reshape(b, c, q, h).permute(0, 3, 1, 2)  # (b, h, c, q): log-decay per step
    a_cum = a.cumsum(dim=-1)

    # 1. Within each chunk: y_i += sum_{j <= i} (C_i . B_j) exp(a_{j+1} + ... + a_i) dt_j x_j
    decay = torch.exp(segsum(a)).view(b, g, r, c, q, q)
    scores = torch.einsum("bcign,bcjgn->bgcij", C, B).unsqueeze(2) * decay  # C_i . B_j once per group
    y_intra = torch.einsum("bgrcij,bcjgrp->bcigrp", scores, xdt)

    # 2. State contributed by each chunk alone, at its last step.
    to_end = torch.exp(a_cum[..., -1:] - a_cum).view(b, g, r, c, q)
    chunk_states = torch.einsum("bcjgn,bgrcj,bcjgrp->bcgrpn", B, to_end, xdt).reshape(b, c, h, p, n)

    # 3. Carry states across chunks: S_c = exp(sum of chunk c's log-decay) S_{c-1} + chunk_states_c.
    if initial_state is None:
        initial_state = torch.zeros(b, h, p, n, dtype=x.dtype, device=x.device)
    states = torch.cat([initial_state.unsqueeze(1), chunk_states], dim=1)  # (b, c+1, h, p, n)
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))  # (b, h, c+1, c+1)
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    prev_states, final_state = states[:, :-1], states[:, -1]  # state entering each chunk; after the last

    # 4. Contribution of the state entering a chunk to each of its outputs.
    from_start = torch.exp(a_cum).view(b, g, r, c, q)
    y_inter = torch.einsum("bcign,bcgrpn,bgrci->bcigrp", C, prev_states.reshape(b, c, g, r, p, n), from_start)

    y = (y_intra + y_inter).reshape(b, L, h, p)[:, :l].to(out_dtype)
    return (y, final_state) if return_final_state else y


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
