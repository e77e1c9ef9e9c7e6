"""The state's diagnostics hook (models/looped.py ``diagnostics``, evaluate/diagnostics.py): the
write rate eta^k = 1 - g^k of eq. (6), the reads' norm against the backbone output they are added to
(Z^{k+1} = H^k + R_{k+1}; the terminal read H^{K-1} + R_K) and the state's norm, recomputed here
by hand from the states the forward returns and the cell's parameters; and the forward's numbers
unchanged by the hook."""

import pytest
import torch
import torch.nn.functional as F

from stateloop.evaluate.diagnostics import curves, step_metrics, summarise
from stateloop.models.registry import build_model
from support.models import tiny_config


def _model(name: str, K: int = 3, **kw):
    torch.manual_seed(0)
    model = build_model(tiny_config(name, K=K, **kw)).double().eval()
    if hasattr(model.cell, "W_delta"):
        with torch.no_grad():  # input-dependent step sizes (W_Delta = 0 at init makes every token's rate equal)
            model.cell.W_delta.weight.normal_(0, 0.5)
    return model


def _rms_norm(x, norm):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def test_stateloop_diagnostics_by_hand():
    model = _model("stateloop")
    K = model.cfg.K
    idx = torch.randint(0, model.cfg.vocab_size, (2, 7))
    plain = model(idx).logits
    diag = {}
    out = model(idx, return_states=True, diagnostics=diag)
    assert torch.equal(out.logits, plain)  # the hook changes nothing
    S = out.states
    s = summarise(diag)
    assert s["states"] == list(range(1, K + 1)) and s["tokens"] == 14

    # By hand: H^0 = T(E); Z^{k+1} = H^k + W_sz RMSNorm_s(S^{k+1}); the terminal read on H^{K-1}.
    with torch.no_grad():
        rope = model.rotary(idx.shape[1], None, idx.device, torch.float64)
        Z = model.embed(idx) * model.cfg.d_model ** 0.5
        cell = model.cell
        for k in range(K):
            H = model.backbone(Z, rope, None)
            U = _rms_norm(H, cell.norm_h)
            delta = F.softplus(U @ cell.W_delta.weight.T + cell.b_delta)
            g = torch.exp(-delta * torch.exp(cell.A_log))  # the retention g^k of (6)
            per_channel = (1 - g).mean(dim=(0, 1))  # the write rate eta^k = 1 - g^k
            assert s["write_rate_mean"][k] == pytest.approx(per_channel.mean().item(), rel=1e-9)
            assert s["write_rate_sd"][k] == pytest.approx(per_channel.std(unbiased=False).item(), rel=1e-9)
            assert s["write_rate_max"][k] == pytest.approx(per_channel.max().item(), rel=1e-9)
            assert s["state_norm"][k] == pytest.approx(S[k].norm(dim=-1).mean().item(), rel=1e-9)
            W = model.W_sz if k < K - 1 else model.W_sout
            R = _rms_norm(S[k], model.norm_s) @ W.weight.T
            assert s["read_ratio"][k] == pytest.approx((R.norm(dim=-1) / H.norm(dim=-1)).mean().item(), rel=1e-9)
            Z = H + R
    assert s["terminal_read_ratio"] == s["read_ratio"][-1]
    assert 0 < min(s["write_rate_min"]) and max(s["write_rate_max"]) < 1
    # MLflow: one curve per quantity stepped by the state index, and per-state metrics of a training step.
    assert curves(s)["state/state_norm"] == list(zip(range(1, K + 1), s["state_norm"]))
    assert step_metrics(s)[f"val/state/read_ratio_{K}"] == s["terminal_read_ratio"]


def test_sums_accumulate_over_batches():
    """Two forwards on halves of a batch give the means of one forward on the whole."""
    model = _model("stateloop")
    idx = torch.randint(0, model.cfg.vocab_size, (4, 6))
    whole, halves = {}, {}
    model(idx, diagnostics=whole)
    model(idx[:2], diagnostics=halves)
    model(idx[2:], diagnostics=halves)
    a, b = summarise(whole), summarise(halves)
    assert a["tokens"] == b["tokens"] == 24
    for q in ("write_rate_mean", "write_rate_sd", "read_ratio", "state_norm"):
        assert a[q] == pytest.approx(b[q], rel=1e-9)


@pytest.mark.parametrize("name, has_write_rate, has_reads, n_states", [
    ("reset_state", True, True, 3),
    ("stateloop_gru", False, True, 3),   # the GRU's update has no single retention
    ("state_only", True, False, 2),      # eq. (13): X^1..X^{K-1}, no reads
])
def test_what_each_variant_reports(name, has_write_rate, has_reads, n_states):
    model = _model(name)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 5))
    plain = model(idx).logits
    diag = {}
    out = model(idx, return_states=True, diagnostics=diag)
    assert torch.equal(out.logits, plain)
    s = summarise(diag)
    assert s["states"] == list(range(1, n_states + 1))
    assert ("write_rate_mean" in s) == has_write_rate and ("read_ratio" in s) == has_reads
    assert s["state_norm"] == pytest.approx([st.norm(dim=-1).mean().item() for st in out.states], rel=1e-9)
