"""The state update (eqs. 2, 5, 6), its initialisation, the GRU and reset variants, the wiring of
the reads, state only (eq. 13) and the analysis hooks. The paper's notation (models/looped.py):
iterations k = 0..K-1, H^k = T(Z^k) the backbone output, S^{k+1} the state it leaves, R_{k+1}
the read of it."""

import math

import pytest
import torch

from stateloop.models.registry import build_model
from stateloop.models.state import GRUStateCell, SelectiveStateCell
from support.models import tiny_config


def _softplus(x):
    return math.log1p(math.exp(x))


def test_eq6_against_hand_computation():
    d, d_s = 2, 3
    cell = SelectiveStateCell(d, d_s).double()
    f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    with torch.no_grad():
        cell.norm_h.weight.copy_(f64([1.0, 2.0]))
        cell.W_u.weight.copy_(f64([[1.0, 0.0], [0.5, -1.0], [0.0, 2.0]]))
        cell.W_delta.weight.copy_(f64([[0.1, 0.2], [-0.3, 0.0], [0.0, 0.5]]))
        cell.b_delta.copy_(f64([0.0, 1.0, -1.0]))
        cell.A_log.copy_(torch.log(f64([0.5, 1.0, 2.0])))
    H = torch.tensor([[[3.0, -4.0]]], dtype=torch.float64)  # H^k
    S = torch.tensor([[[1.0, -2.0, 0.5]]], dtype=torch.float64)  # S^k
    # by hand: RMS of (3, -4) is sqrt(12.5); U = (3, -4) / sqrt(12.5) * (1, 2)
    r = math.sqrt((9 + 16) / 2 + cell.norm_h.eps)
    U = [3 / r * 1.0, -4 / r * 2.0]
    Wu = [[1.0, 0.0], [0.5, -1.0], [0.0, 2.0]]
    Wd = [[0.1, 0.2], [-0.3, 0.0], [0.0, 0.5]]
    bd, lam, s0 = [0.0, 1.0, -1.0], [0.5, 1.0, 2.0], [1.0, -2.0, 0.5]
    expected = []
    for c in range(3):
        P = Wu[c][0] * U[0] + Wu[c][1] * U[1]
        delta = _softplus(Wd[c][0] * U[0] + Wd[c][1] * U[1] + bd[c])
        g = math.exp(-delta * lam[c])
        expected.append(g * s0[c] + (1 - g) * P)
    got = cell(S, H)[0, 0].tolist()  # S^{k+1}
    assert got == pytest.approx(expected, abs=1e-12)
    # S^0 = 0: the first update writes (1 - g) P only
    assert cell(None, H)[0, 0].tolist() == pytest.approx(
        [e - math.exp(-_softplus(Wd[c][0] * U[0] + Wd[c][1] * U[1] + bd[c]) * lam[c]) * s0[c] for c, e in enumerate(expected)],
        abs=1e-12,
    )


def test_float32_retention_holds_at_large_step_sizes_with_finite_gradients():
    """Paper, Sec. 3: "The retention gate g^k = exp(-lambda (.) Delta^k) weights the previous
    state", with Delta^k = softplus(U^k W_Delta^T + b_Delta) (eq. 6). A slow channel (lambda = 0.01)
    with a pre-activation of 90 keeps exp(-0.9) = 0.41 of its state, in float32 too. Fails for the
    same function written as sigmoid(-x)^lambda (two operators instead of three): sigmoid(-90)
    underflows to 0 in float32, so g would be 0 and its backward NaN (benchmarks/records/2026-12-05-norms-as-functions.md)."""
    cell = SelectiveStateCell(2, 2)
    with torch.no_grad():
        cell.norm_h.weight.fill_(1.0)
        cell.W_u.weight.fill_(0.5)
        cell.W_delta.weight.zero_()
        cell.b_delta.fill_(90.0)  # the pre-activation U W_Delta^T + b_Delta of every token
        cell.A_log.copy_(torch.log(torch.tensor([0.01, 1.0])))
    H = torch.tensor([[[1.0, -2.0]]])
    g = cell.gates(H)[1][0, 0]
    assert g[0].item() == pytest.approx(math.exp(-0.9), rel=1e-5)
    assert 0 <= g[1].item() < 1e-38  # exp(-90)
    S = torch.tensor([[[1.0, 1.0]]], requires_grad=True)
    cell(S, H).sum().backward()
    grads = [S.grad] + [p.grad for p in cell.parameters()]
    assert all(torch.isfinite(t).all() for t in grads)
    assert S.grad[0, 0, 0].item() == pytest.approx(math.exp(-0.9), rel=1e-5)  # dS~/dS = g


def test_initial_write_rate_is_one_minus_exp_minus_03_lambda():
    d_s = 16
    model = build_model(tiny_config("stateloop", d_s=d_s))
    lam = torch.logspace(math.log10(0.01), math.log10(4.0), d_s, dtype=torch.float64)
    assert torch.exp(model.cell.A_log.double()).tolist() == pytest.approx(lam.tolist(), rel=1e-6)
    assert torch.count_nonzero(model.cell.W_delta.weight) == 0
    assert _softplus(model.cell.b_delta[0].item()) == pytest.approx(0.3, abs=1e-6)
    H = torch.randn(2, 5, model.cfg.d_model)  # any input: W_Delta = 0 makes the rate input-free
    rate = model.cell.write_rate(H)
    expected = (1 - torch.exp(-0.3 * lam)).float()
    assert torch.allclose(rate, expected.expand_as(rate), atol=1e-6)


def test_gru_cell_against_hand_computation():
    d, d_s = 3, 2
    cell = GRUStateCell(d, d_s).double()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in cell.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    H = torch.randn(1, 1, d, dtype=torch.float64)
    S_prev = torch.randn(1, 1, d_s, dtype=torch.float64)
    U = H[0, 0] / torch.sqrt(H[0, 0].pow(2).mean() + cell.norm_h.eps) * cell.norm_h.weight
    P = cell.W_u.weight @ U
    g = cell.gru
    Wir, Wiz, Win = g.weight_ih.chunk(3)
    Whr, Whz, Whn = g.weight_hh.chunk(3)
    bir, biz, bin_ = g.bias_ih.chunk(3)
    bhr, bhz, bhn = g.bias_hh.chunk(3)
    s = S_prev[0, 0]
    r = torch.sigmoid(Wir @ P + bir + Whr @ s + bhr)
    z = torch.sigmoid(Wiz @ P + biz + Whz @ s + bhz)
    n = torch.tanh(Win @ P + bin_ + r * (Whn @ s + bhn))
    expected = (1 - z) * n + z * s
    assert torch.allclose(cell(S_prev, H)[0, 0], expected, atol=1e-12)


def _manual_forward(model, idx):
    """StateLoop composed by hand from the model's modules, in the paper's letters: Z^0 = E,
    S^0 = 0; for k = 0..K-1: H^k = T(Z^k), S^{k+1} = Mixer(Update(S^k, H^k)),
    Z^{k+1} = H^k + W_{s->z} RMSNorm_s(S^{k+1}); logits = W_o RMSNorm_f(H^{K-1} + W_{s->out} RMSNorm_s(S^K))."""
    cfg = model.cfg
    rope = model.rotary(idx.shape[1], None, idx.device, torch.float32)
    Z = model.embed.weight[idx] * math.sqrt(cfg.d_model)  # Z^0 = E
    S, states = None, []  # S^0 = 0
    for k in range(cfg.K):
        H = Z
        for layer in model.backbone.layers:
            H = layer(H, rope)  # H^k = T(Z^k)
        S = model.cell(None if model.reset else S, H)  # S^{k+1}: (2), (5), (6); (14) forgets S^k
        S = model.mixer(S, rope)  # (7)-(9)
        states.append(S)
        if k < cfg.K - 1:
            Z = H + model.W_sz(model.norm_s(S))  # Z^{k+1} = H^k + R_{k+1}
    out = H + model.W_sout(model.norm_s(S))  # H^{K-1} + R_K
    return model.head(model.norm_f(out)), states


@pytest.mark.parametrize("name", ["stateloop", "stateloop_attn", "stateloop_mamba2", "reset_state", "stateloop_gru"])
def test_forward_composes_the_equations(name):
    cfg = tiny_config(name, d_s=24)
    model = build_model(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 13))
    with torch.no_grad():
        out = model(idx, return_states=True)
        logits, states = _manual_forward(model, idx)
    assert (out.logits - logits).abs().max() < 1e-5
    assert len(out.states) == cfg.K
    for a, b in zip(out.states, states):
        assert (a - b).abs().max() < 1e-5


def test_reset_state_forgets_previous_iterations():
    """With the reset (eq. 14), S^{k+1} = eta^k P^k = (1 - g^k) P^k of iteration k alone."""
    model = build_model(tiny_config("reset_state")).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (1, 9))
    captured = []
    handle = model.backbone.register_forward_hook(lambda m, i, o: captured.append(o))
    with torch.no_grad():
        out = model(idx, return_states=True)
    handle.remove()
    for H, S in zip(captured, out.states):  # H^k, S^{k+1}
        P, g = model.cell.gates(H)
        assert torch.allclose(S, (1 - g) * P, atol=1e-6)


def test_state_only_follows_eq13():
    """Paper, eq. (13): "The state-only alternative uses a gated state itself as the next backbone
    input Z^{k+1}. From X^0 = 0 and H^0 = T(E), its recurrence for k = 0..K-2 is
    X^{k+1} = Cell(H^k, X^k), Z^{k+1} = X^{k+1}, H^{k+1} = T(Z^{k+1})"; the prediction reads
    H^{K-1} through the final norm and head. Composed here in the paper's letters from the
    model's modules (Cell = eq. (6) at width d, computed by hand from W_u, W_Delta, b_Delta, A_log).

    A misreading that keeps the vanilla loop (H^{k+1} = T(H^k)) and reads the state at the head,
    or that adds the state to the previous output (Z^{k+1} = H^k + X^{k+1}), fails here."""
    torch.manual_seed(3)
    model = build_model(tiny_config("state_only", K=4)).double().eval()
    with torch.no_grad():  # a non-trivial W_Delta (zero at init) so that the gate depends on H^k
        model.cell.W_delta.weight.normal_(std=0.3)
    cfg, cell = model.cfg, model.cell
    idx = torch.randint(0, cfg.vocab_size, (2, 11))
    rope = model.rotary(idx.shape[1], None, idx.device, torch.float64)

    def T(z):
        for layer in model.backbone.layers:
            z = layer(z, rope)
        return z

    def Cell(H, X_prev):  # eq. (6) with H as input and X_prev as previous state
        U = H / torch.sqrt(H.pow(2).mean(-1, keepdim=True) + cell.norm_h.eps) * cell.norm_h.weight
        P = U @ cell.W_u.weight.T
        delta = torch.nn.functional.softplus(U @ cell.W_delta.weight.T + cell.b_delta)
        g = torch.exp(-delta * torch.exp(cell.A_log))
        return g * X_prev + (1 - g) * P

    with torch.no_grad():
        E = model.embed.weight[idx] * math.sqrt(cfg.d_model)
        X, H = torch.zeros_like(E), T(E)  # X^0 = 0, H^0 = T(E)
        gated = []
        for k in range(cfg.K - 1):
            X = Cell(H, X)  # X^{k+1}
            gated.append(X)
            H = T(X)  # H^{k+1} = T(Z^{k+1}), Z^{k+1} = X^{k+1}
        expected = model.head(model.norm_f(H))
        out = model(idx, return_states=True)
    assert (out.logits - expected).abs().max() < 1e-10
    assert len(out.states) == cfg.K - 1
    for ours, theirs in zip(out.states, gated):
        assert (ours - theirs).abs().max() < 1e-10
    assert not any(n.startswith(("W_sz", "W_sout", "norm_s")) for n, _ in model.named_parameters())


class TestHooks:
    @pytest.fixture
    def model(self):
        return build_model(tiny_config("stateloop", K=3)).eval()

    def test_mask_of_ones_changes_nothing_and_batched_masks_equal_single(self, model):
        idx = torch.randint(0, model.cfg.vocab_size, (1, 11))
        masks = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.float32)
        with torch.no_grad():
            plain = model(idx).logits
            assert torch.allclose(model(idx, read_mask=torch.ones(3)).logits, plain)
            batched = model(idx.expand(4, -1), read_mask=masks).logits
            for i, m in enumerate(masks):
                assert torch.allclose(batched[i], model(idx, read_mask=m).logits[0], atol=1e-6)
            assert (batched[1] - plain[0]).abs().max() > 1e-4

    def test_terminal_mask_reads_backbone_output_only(self, model):
        idx = torch.randint(0, model.cfg.vocab_size, (1, 7))
        captured = []
        h = model.backbone.register_forward_hook(lambda m, i, o: captured.append(o))
        with torch.no_grad():
            logits = model(idx, read_mask=torch.tensor([1.0, 1.0, 0.0])).logits
        h.remove()
        assert torch.allclose(logits, model.head(model.norm_f(captured[-1])), atol=1e-6)

    def test_overriding_a_state_with_itself_is_the_identity_and_overrides_propagate(self, model):
        idx = torch.randint(0, model.cfg.vocab_size, (2, 10))
        with torch.no_grad():
            out = model(idx, return_states=True)
            same = model(idx, state_overrides={2: out.states[1]}).logits
            assert torch.allclose(same, out.logits, atol=1e-6)
            frozen = model(idx, return_states=True, state_overrides={2: out.states[0], 3: out.states[0]})
            assert torch.equal(frozen.states[1], out.states[0]) and torch.equal(frozen.states[2], out.states[0])
            assert (frozen.logits - out.logits).abs().max() > 1e-4

    def test_read_i_and_state_i_name_the_same_boundary(self):
        """Figure 4 numbers reads and states alike ("R1..R6" feedback, "R7" terminal at K = 7;
        "replace S4 with calibrated S3"): R_i is the read of S^i. With the reset ablation the
        next update ignores S^i, so once R_i is masked (read_mask entry i-1) nothing sees S^i
        and overriding it (state_overrides key i) changes no logit; masking the read of a
        neighbouring boundary instead leaves the override visible. An off-by-one between the two
        hooks' indices fails here."""
        K = 4
        model = build_model(tiny_config("reset_state", K=K)).eval()
        idx = torch.randint(0, model.cfg.vocab_size, (1, 9))
        with torch.no_grad():
            for i in range(1, K + 1):
                noise = {i: torch.randn(model.cfg.d_s)}
                for j in range(1, K + 1):
                    mask = torch.ones(K)
                    mask[j - 1] = 0.0  # R_j masked
                    plain = model(idx, read_mask=mask).logits
                    changed = (model(idx, read_mask=mask, state_overrides=noise).logits - plain).abs().max()
                    assert (changed == 0) == (i == j), (i, j, changed)

    def test_bad_mask_shape_is_an_error(self, model):
        with pytest.raises(ValueError, match="read_mask"):
            model(torch.zeros(1, 4, dtype=torch.long), read_mask=torch.ones(2))


@pytest.mark.parametrize("read_init", ["residual", "input"])
def test_read_projections_init(read_init):
    """model.read_init: "residual" draws W_{s->z}, W_{s->out} as the residual-output projections
    (N(0, 0.02 / sqrt(2 K L))), "input" as input projections (N(0, 0.02)); the cell is the paper's
    either way."""
    import dataclasses

    cfg = dataclasses.replace(tiny_config("stateloop", K=7, d_s=64, d_model=64, n_heads=4, head_dim=16, d_ff=128),
                              read_init=read_init)
    torch.manual_seed(0)
    model = build_model(cfg)
    n_apps = cfg.K * cfg.n_layers
    expected = 0.02 / math.sqrt(2 * n_apps) if read_init == "residual" else 0.02
    for W in (model.W_sz, model.W_sout):
        assert math.isclose(W.weight.std().item(), expected, rel_tol=0.05)
    assert torch.all(model.cell.W_delta.weight == 0)
    assert math.isclose(model.cell.W_u.weight.std().item(), 0.02, rel_tol=0.05)


def test_fused_projections_follow_every_parameter_change():
    """W_u and W_Delta run as one matmul on their concatenation, kept between decoding calls: it
    must follow in-place updates (an optimizer step, a checkpoint load) and casts, and equal eq. (5)
    and eq. (6)'s gate computed from the two weights separately."""
    torch.manual_seed(0)
    cell = SelectiveStateCell(8, 4)
    cell.reset_parameters(0.3)
    H = torch.randn(2, 3, 8)

    def by_hand():
        U = H / H.pow(2).mean(-1, keepdim=True).add(cell.norm_h.eps).sqrt() * cell.norm_h.weight  # (2)
        P = U @ cell.W_u.weight.T
        return P, torch.exp(-torch.nn.functional.softplus(U @ cell.W_delta.weight.T + cell.b_delta) * cell.A_log.exp())

    for step in range(3):
        with torch.inference_mode():
            P, g = cell.gates(H)
        with torch.no_grad():
            P_ref, g_ref = by_hand()
            torch.testing.assert_close(P, P_ref)
            torch.testing.assert_close(g, g_ref)
            torch.testing.assert_close(cell.gates(H)[1], g_ref)  # with gradients off but no inference mode
            for p in (cell.W_u.weight, cell.W_delta.weight, cell.b_delta, cell.A_log):
                p.add_(0.1 * torch.randn_like(p))  # in place, as an optimizer step
    cell.double()
    H = H.double()
    with torch.inference_mode():
        P, g = cell.gates(H)
    with torch.no_grad():
        assert P.dtype == g.dtype == torch.float64
        torch.testing.assert_close(g, by_hand()[1])
