"""StateLoop's cell as the paper's equations (models/state.py, what forward runs) and its fused
inference form (models/fused.py, ``selective_state_step``): the cell is eqs. (2), (5), (6) as
printed, and the fused form agrees with it to the dtype's rounding (one product with
[W_u; W_Delta] and eq. (6) as one lerp round differently from two products and g S + (1 - g) P)."""

import math

import pytest
import torch
import torch.nn.functional as F

import stateloop.fast as fast
import stateloop.models.fused as fused
from stateloop.models.registry import build_model
from stateloop.models.state import SelectiveStateCell
from support.models import tiny_config


def _cell(d=16, d_s=24, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cell = SelectiveStateCell(d, d_s)
    cell.reset_parameters(std=0.3)
    with torch.no_grad():  # away from the init (W_Delta = 0), so that Delta^k varies with the token
        cell.W_delta.weight.normal_(std=0.5)
        cell.b_delta.normal_()
        cell.norm_h.weight.uniform_(0.5, 1.5)
    return cell.to(dtype)


def _inputs(d=16, d_s=24, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    H = torch.randn(3, 5, d, generator=g).to(dtype)  # H^k in the activations' dtype
    S = torch.randn(3, 5, d_s, generator=g, dtype=torch.float64).to(torch.promote_types(dtype, torch.float32))  # S^k, wide
    return H, S


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("first", [False, True], ids=["S^k", "S^k=0"])
def test_the_fused_form_is_the_printed_forward_to_the_dtypes_rounding(dtype, first):
    """Without gradients an accelerated cell (fast.accelerate) takes fused.selective_state_step on
    its kept fused weights; with them, the printed forward. Both keep the state in the wide dtype
    (a bf16 model keeps it in float32) and agree to within a few ulps of the state's dtype (the
    bf16 products: to bf16's rounding), also on the second call (the kept weights)."""
    cell = _cell(dtype=dtype)
    H, S = _inputs(dtype=dtype)
    S = None if first else S
    reference = cell(S, H).detach()
    fast.accelerate(cell)
    calls = []
    step = fused.selective_state_step
    fused.selective_state_step = lambda *a: calls.append(1) or step(*a)
    try:
        assert torch.equal(cell(S, H), reference)  # with gradients: the printed forward itself
        assert calls == []
        tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
        with torch.no_grad():
            for _ in range(2):
                twin = cell(S, H)
                assert twin.dtype == reference.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
                torch.testing.assert_close(twin, reference, rtol=tol, atol=tol)
    finally:
        fused.selective_state_step = step
    assert calls == [1, 1]


def _paper_eq6(cell, S, H):
    """Eqs. (2), (5), (6) as printed, in float64: two products, g S + (1 - g) P."""
    f = lambda t: t.detach().double()  # noqa: E731
    H = f(H)
    U = H / torch.sqrt(H.pow(2).mean(-1, keepdim=True) + cell.norm_h.eps) * f(cell.norm_h.weight)  # (2)
    P = U @ f(cell.W_u.weight).T  # (5)
    Delta = F.softplus(U @ f(cell.W_delta.weight).T + f(cell.b_delta))  # (6)
    lam = torch.exp(f(cell.A_log))
    g = torch.exp(-lam * Delta)
    S = torch.zeros_like(P) if S is None else f(S)
    return g * S + (1 - g) * P


@pytest.mark.parametrize("first", [False, True], ids=["S^k", "S^k=0"])
def test_the_reference_is_eq6_as_printed(first):
    """Paper, Sec. 3.2: "S~^{k+1} = exp(-lambda (.) Delta^k) (.) S^k + (1 - exp(-lambda (.) Delta^k))
    (.) P^k" (eq. 6), with "P^k = U^k W_u^T" (eq. 5), "Delta^k = softplus(U^k W_Delta^T + b_Delta),
    lambda = exp(A_log)" and "U^k = RMSNorm_h(H^k)" (eq. 2). The forward runs these lines; the
    reference here is float64 with its own RMSNorm, so the comparison is to float32's rounding
    (a float64 cell: to float64's), for the printed forward and the fused form alike."""
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        cell = _cell(dtype=dtype)
        H, S = _inputs(dtype=dtype)
        S = None if first else S
        expected = _paper_eq6(cell, S, H)
        for accelerated in (False, True):
            if accelerated:
                fast.accelerate(cell)
            with torch.no_grad():
                got = cell(S, H).double()
            torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_the_reference_gradients_are_eq6s():
    """The gradients of every parameter of eqs. (2), (5), (6) through the reference are those of the
    printed equations (float64 cell, to float64's rounding)."""
    cell = _cell(dtype=torch.float64)
    H, S = _inputs(dtype=torch.float64)
    H.requires_grad_(True)
    weight = torch.randn(3, 5, 24, dtype=torch.float64)
    names = ["norm_h.weight", "W_u.weight", "W_delta.weight", "b_delta", "A_log"]
    params = [dict(cell.named_parameters())[n] for n in names]

    got = torch.autograd.grad((cell(S, H) * weight).sum(), params + [H])
    twin = SelectiveStateCell(16, 24).double()
    twin.load_state_dict(cell.state_dict())
    twin_params = [dict(twin.named_parameters())[n] for n in names]
    # the printed form, differentiable: _paper_eq6 on parameters that keep their graph
    f = dict(zip(names, twin_params))
    U = H / torch.sqrt(H.pow(2).mean(-1, keepdim=True) + twin.norm_h.eps) * f["norm_h.weight"]
    P = U @ f["W_u.weight"].T
    g = torch.exp(-torch.exp(f["A_log"]) * F.softplus(U @ f["W_delta.weight"].T + f["b_delta"]))
    expected = torch.autograd.grad(((g * S + (1 - g) * P) * weight).sum(), twin_params + [H])
    for name, a, b in zip(names + ["H^k"], got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_eq6_one_channel_by_hand():
    """Paper, Sec. 3.2: "The retention gate g^k = exp(-lambda (.) Delta^k) weights the previous
    state, while the write gate eta^k = 1 - g^k weights the projected output P^k." One token, one
    state channel, d = 1: U = RMSNorm_h(H) = sign(H) w_h (up to eps), P = W_u U, Delta = softplus(W_Delta U + b)."""
    cell = SelectiveStateCell(1, 1).double()
    with torch.no_grad():
        cell.norm_h.weight.fill_(2.0)
        cell.W_u.weight.fill_(0.75)
        cell.W_delta.weight.fill_(0.5)
        cell.b_delta.fill_(-1.0)
        cell.A_log.fill_(math.log(3.0))  # lambda = 3
    H = torch.tensor([[[5.0]]], dtype=torch.float64)
    S = torch.tensor([[[-1.0]]], dtype=torch.float64)
    U = 5.0 / math.sqrt(25.0 + cell.norm_h.eps) * 2.0  # (2): about 2
    P = 0.75 * U  # (5)
    Delta = math.log1p(math.exp(0.5 * U - 1.0))  # softplus(0.0) = log 2
    g = math.exp(-3.0 * Delta)  # exp(-3 log 2) = 1/8
    assert g == pytest.approx(0.125, rel=1e-5)
    eta = 1 - g
    for grad in (True, False):
        if not grad:
            fast.accelerate(cell)
        with torch.set_grad_enabled(grad):
            assert cell(S, H).item() == pytest.approx(g * -1.0 + eta * P, abs=1e-14)
            assert cell(None, H).item() == pytest.approx(eta * P, abs=1e-14)
            assert cell.write_rate(H).item() == pytest.approx(eta, abs=1e-14)


def test_the_reads_are_eqs_4_and_10():
    """Paper, Sec. 3.1: "Z^{k+1} = H^k + N^{k+1} W_{s->z}^T" (eq. 4) and "Y = H^{K-1} +
    RMSNorm_s(S^K) W_{s->out} = H^{K-1} + N^K W_{s->out}^T" (eq. 10), N^{k+1} = RMSNorm_s(S^{k+1}) (eq. 3)."""
    model = build_model(tiny_config("stateloop"))
    torch.manual_seed(3)
    with torch.no_grad():
        model.norm_s.weight.uniform_(0.5, 1.5)
    d, d_s = model.cfg.d_model, model.cfg.d_s
    H = torch.randn(2, 4, d, dtype=torch.float64)
    S = torch.randn(2, 4, d_s, dtype=torch.float64)
    model.double()
    N = S / torch.sqrt(S.pow(2).mean(-1, keepdim=True) + model.norm_s.eps) * model.norm_s.weight.detach()
    torch.testing.assert_close(model.feedback(H, S), H + N @ model.W_sz.weight.detach().T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(model.terminal(H, S), H + N @ model.W_sout.weight.detach().T, rtol=1e-12, atol=1e-12)
