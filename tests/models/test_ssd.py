"""The pure-PyTorch Mamba-2 path: chunked SSD against the sequential recurrence, and the whole
block against a naive per-token implementation written here from the Mamba-2 equations."""

import math

import pytest
import torch
import torch.nn.functional as F

from stateloop.models.kernels import causal_conv1d_ref
from stateloop.models.mixers import Mamba2, Mamba2Cache
from stateloop.models.ssd import ssd_chunked, ssd_sequential


def _inputs(b, l, h, p, g, n, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, l, h, p, generator=gen, dtype=dtype)
    dt = F.softplus(torch.randn(b, l, h, generator=gen, dtype=dtype))
    A = -torch.rand(h, generator=gen, dtype=dtype) * 3 - 0.1
    B = torch.randn(b, l, g, n, generator=gen, dtype=dtype)
    C = torch.randn(b, l, g, n, generator=gen, dtype=dtype)
    return x, dt, A, B, C


def _naive_recurrence(x, dt, A, B, C, state=None):
    """The Mamba-2 recurrence with explicit loops over batch, time and heads (float64)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    per_group = h // g
    state = torch.zeros(b, h, p, n, dtype=x.dtype) if state is None else state.clone()
    y = torch.zeros_like(x)
    for bi in range(b):
        for t in range(l):
            for hi in range(h):
                gi = hi // per_group
                decay = math.exp(float(dt[bi, t, hi] * A[hi]))
                state[bi, hi] = decay * state[bi, hi] + float(dt[bi, t, hi]) * torch.outer(x[bi, t, hi], B[bi, t, gi])
                y[bi, t, hi] = state[bi, hi] @ C[bi, t, gi]
    return y, state


@pytest.mark.parametrize("length", [1, 5, 8, 21, 40])
@pytest.mark.parametrize("chunk", [4, 8])
def test_chunked_equals_naive_recurrence_float64(length, chunk):
    x, dt, A, B, C = _inputs(2, length, 4, 3, 2, 5)
    s0 = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    y_ref, s_ref = _naive_recurrence(x, dt, A, B, C, s0)
    y, s = ssd_chunked(x, dt, A, B, C, chunk, initial_state=s0, return_final_state=True)
    assert (y - y_ref).abs().max() < 1e-10
    assert (s - s_ref).abs().max() < 1e-10
    y2, s2 = ssd_sequential(x, dt, A, B, C, initial_state=s0, return_final_state=True)
    assert (y2 - y_ref).abs().max() < 1e-10 and (s2 - s_ref).abs().max() < 1e-10


def test_an_empty_sequence_passes_the_state_through():
    """No steps: no outputs, and the final state is the entering one (zeros without one)."""
    x, dt, A, B, C = _inputs(2, 0, 4, 3, 2, 5)
    s0 = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    y, s = ssd_chunked(x, dt, A, B, C, 4, initial_state=s0, return_final_state=True)
    assert y.shape == (2, 0, 4, 3) and torch.equal(s, s0)
    y, s = ssd_chunked(x, dt, A, B, C, 4, return_final_state=True)
    assert y.shape == (2, 0, 4, 3) and s.shape == (2, 4, 3, 5) and not s.any()


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("initial", [False, True])
def test_chunked_gradients_equal_sequential(groups, initial):
    """Gradients of every input, A and the entering state included, through outputs and the
    final state, over several chunks (13 steps in chunks of 4: the last one padded)."""
    x, dt, A, B, C = _inputs(2, 13, 4, 3, groups, 4)
    s0 = torch.randn(2, 4, 3, 4, dtype=torch.float64) if initial else None
    inputs = [x, dt, A, B, C] + ([s0] if initial else [])
    for t in inputs:
        t.requires_grad_(True)
    gen = torch.Generator().manual_seed(1)
    gy, gs = torch.randn(2, 13, 4, 3, generator=gen, dtype=torch.float64), torch.randn(2, 4, 3, 4, generator=gen, dtype=torch.float64)

    def grads(fn, *chunk):
        y, s = fn(x, dt, A, B, C, *chunk, initial_state=s0, return_final_state=True)
        return torch.autograd.grad((y * gy).sum() + (s * gs).sum(), inputs)

    for a, b in zip(grads(ssd_chunked, 4), grads(ssd_sequential)):
        assert (a - b).abs().max() < 1e-10


@pytest.mark.parametrize("history", [False, True])
def test_causal_conv1d_twin_equals_torch_grouped_conv1d(history):
    """The twin's shifted multiply-adds (kernels.causal_conv1d_ref) against torch's own depthwise
    conv1d, values and the gradients of input, weight, bias and history: tap W - 1 multiplies the
    current input, tap 0 the input W - 1 steps back."""
    gen = torch.Generator().manual_seed(0)
    Bsz, T, Cc, W = 2, 9, 6, 4
    x, w, b = (torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
               for shape in ((Bsz, T, Cc), (Cc, 1, W), (Cc,)))
    hist = torch.randn(Bsz, W - 1, Cc, generator=gen, dtype=torch.float64, requires_grad=True) if history else None
    got = causal_conv1d_ref(x, w, b, history=hist)
    full = torch.cat([hist if history else torch.zeros(Bsz, W - 1, Cc, dtype=torch.float64), x], 1)
    expected = F.silu(F.conv1d(full.transpose(1, 2), w, b, groups=Cc)).transpose(1, 2)
    assert got.shape == x.shape and (got - expected).abs().max() < 1e-12
    leaves = [x, w, b] + ([hist] if history else [])
    g = torch.randn(Bsz, T, Cc, generator=gen, dtype=torch.float64)
    for a, e in zip(torch.autograd.grad((got * g).sum(), leaves), torch.autograd.grad((expected * g).sum(), leaves)):
        assert (a - e).abs().max() < 1e-12


@torch.no_grad()
@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("mode", ["full", "decode", "prefill+decode"])
def test_mamba2_block_equals_naive_per_token_block(mode, G):
    """The block (full forward, token-by-token decoding from the first token, or a 5-token
    prefill then single-token steps) against the equations evaluated naively."""
    torch.manual_seed(0)
    d, expand, N, W, P = 8, 2, 4, 4, 4
    m = Mamba2(d, expand, N, W, P, G, chunk_size=4, impl="torch").double()
    m.reset_parameters(0.5)
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
    u = torch.randn(2, 11, d, dtype=torch.float64)
    if mode == "full":
        got = m(u)
    else:
        cache = Mamba2Cache()
        first = 5 if mode == "prefill+decode" else 0
        parts = [m(u[:, :first], cache)] if first else []
        parts += [m(u[:, t : t + 1], cache) for t in range(first, u.shape[1])]
        got = torch.cat(parts, 1)

    # Naive: projections, an explicit causal depthwise convolution, the recurrence, D skip,
    # grouped gated RMSNorm, output projection.
    d_in, H = expand * d, expand * d // P
    zxbcdt = u @ m.in_proj.weight.T
    z, xBC, dt = zxbcdt.split([d_in, d_in + 2 * G * N, H], dim=-1)
    conv = torch.zeros_like(xBC)
    w = m.conv1d.weight[:, 0, :]  # (C, W): tap W-1 multiplies the current token
    for t in range(u.shape[1]):
        acc = m.conv1d.bias.clone().expand(u.shape[0], -1).clone()
        for j in range(W):
            src = t - (W - 1) + j
            if src >= 0:
                acc = acc + w[:, j] * xBC[:, src]
        conv[:, t] = acc
    conv = conv * torch.sigmoid(conv)
    x, Bm, Cm = conv.split([d_in, G * N, G * N], dim=-1)
    dt = F.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    y, _ = _naive_recurrence(x.view(2, 11, H, P), dt, A, Bm.view(2, 11, G, N), Cm.view(2, 11, G, N))
    y = y + m.D[:, None] * x.view(2, 11, H, P)
    y = y.reshape(2, 11, d_in) * (z * torch.sigmoid(z))
    gs = d_in // G
    yg = y.view(2, 11, G, gs)
    yg = yg / torch.sqrt(yg.pow(2).mean(-1, keepdim=True) + m.norm.eps)
    expected = (yg.view(2, 11, d_in) * m.norm.weight) @ m.out_proj.weight.T
    assert (got - expected).abs().max() < 1e-10


def test_mamba2_parameter_count_formula():
    d, E, N, W, P, G = 64, 2, 16, 4, 16, 4
    m = Mamba2(d, E, N, W, P, G, chunk_size=8)
    d_in, H = E * d, E * d // P
    expected = d * (2 * d_in + 2 * G * N + H) + (d_in + 2 * G * N) * (W + 1) + 3 * H + d_in + d_in * d
    assert sum(p.numel() for p in m.parameters()) == expected
