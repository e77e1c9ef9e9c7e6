"""Mixed precision: every registered model under bf16 autocast on the CPU (the nearest run here of
``precision: bf16-mixed`` in configs/paper.yaml and configs/gpu.yaml), models cast whole to bf16
(Table 3's decoding, ``analyze --dtype bfloat16``), float64 runs kept in float64, and the state's
dtype contract (models/state.py): the state is kept in float32.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from stateloop.models import kernels
from stateloop.models.cache import ModelCache
from stateloop.models.registry import MODELS, build_model
from stateloop.models.state import DELTA_INIT, LAMBDA_RANGE, SelectiveStateCell
from support.models import tiny_config

ALL = sorted(MODELS)
STATEFUL = [n for n in ALL if MODELS[n].has_state]


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at magnitude x (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


def decode(model, idx, prompt: int) -> torch.Tensor:
    """Prefill ``prompt`` tokens, then one token at a time, then the last three as one chunk."""
    cache = ModelCache()
    T = idx.shape[1]
    parts = [model(idx[:, :prompt], cache=cache).logits]
    parts += [model(idx[:, t : t + 1], cache=cache).logits for t in range(prompt, T - 3)]
    parts.append(model(idx[:, T - 3 :], cache=cache).logits)
    return torch.cat(parts, 1)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.slow
def test_bf16_autocast_forward_backward_and_cached_decoding(name):
    """Forward and backward under CPU bf16 autocast, then cached decoding against the full forward.

    Tolerance: both paths round the logits to bf16 in the head's matmul, so they can differ by a
    few bf16 units in the last place of the largest logit even when both are right; we allow 4 of
    them (about 2% of the logits' scale here). A decoding bug (a lost position, a missing cache
    entry) changes logits by their own scale: the negative control, decoding each token without
    its context, must miss the tolerance."""
    torch.manual_seed(0)
    model = build_model(tiny_config(name))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 21))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx).logits
        loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), idx[:, 1:].flatten())
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
    loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0]
    assert not bad, f"{name}: no finite gradient under bf16 autocast for {bad}"

    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(idx).logits.float()
        tol = 4 * bf16_ulp(full.abs().max().item())
        for prompt in (1, 6):
            assert (decode(model, idx, prompt).float() - full).abs().max() <= tol, (name, prompt)
        contextless = torch.cat([model(idx[:, t : t + 1]).logits.float() for t in range(idx.shape[1])], 1)
    assert (contextless - full).abs().max() > tol


@pytest.mark.parametrize("name", ALL)
def test_model_cast_to_bf16_decodes_like_its_full_forward(name):
    """A model cast whole to bf16 (the decoding benchmark's dtype on a GPU) runs, with its state in
    float32, and decodes like its own full forward (tolerance as above)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(name)).eval().to(torch.bfloat16)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 17))
    with torch.no_grad():
        out = model(idx, return_states=True) if MODELS[name].has_state else model(idx)
        full = out.logits.float()
        assert out.logits.dtype == torch.bfloat16
        if MODELS[name].has_state:
            assert all(S.dtype == torch.float32 for S in out.states)
        assert (decode(model, idx, 4).float() - full).abs().max() <= 4 * bf16_ulp(full.abs().max().item())


@pytest.mark.parametrize("name", STATEFUL)
def test_state_is_float32_under_autocast(name):
    model = build_model(tiny_config(name)).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (1, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        states = model(idx, return_states=True).states
    assert states and all(S.dtype == torch.float32 for S in states)


def test_slow_channels_survive_bf16_autocast():
    """Paper, Sec. 3: lambda is log-spaced in [0.01, 4] and softplus(b_Delta) = 0.3 at init, so the
    slowest channel writes 1 - exp(-0.003) = 0.3% of the proposal per iteration. Over K = 7
    iterations of a constant proposal P, eq. (6) from S^0 = 0 gives S^7 = (1 - g^7) P. Under bf16 autocast the
    state must follow it for the P and g that autocast computes (to float32 rounding); the same
    update with a bf16 state, computed alongside, is off by tens of percent, which is why the
    state is float32."""
    d, K = 16, 7
    torch.manual_seed(0)
    cell = SelectiveStateCell(d, d)
    cell.reset_parameters(0.3)
    H = torch.randn(1, 3, d)  # the same backbone output H^k at every iteration
    with torch.no_grad():
        g64 = cell.gates(H)[1].double()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # the proposal and gate autocast computes
            P_ac, g_ac = (t.double() for t in cell.gates(H))
        expected = (1 - g_ac**K) * P_ac  # constant H: the same P and g at every iteration
        S = None
        S_bf16 = torch.zeros_like(H, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            for _ in range(K):
                S = cell(S, H)
                P, g = cell.gates(H)
                S_bf16 = torch.lerp(P.to(torch.bfloat16), S_bf16, g.to(torch.bfloat16))
    slow = 0  # lambda = 0.01: the slowest channel
    assert math.isclose(math.exp(cell.A_log[slow].item()), LAMBDA_RANGE[0], rel_tol=1e-6)
    assert math.isclose(1 - g64[0, 0, slow].item(), 1 - math.exp(-DELTA_INIT * LAMBDA_RANGE[0]), rel_tol=1e-3)
    assert S.dtype == torch.float32
    rel = ((S.double() - expected) / expected)[..., slow].abs().max().item()
    rel_bf16 = ((S_bf16.double() - expected) / expected)[..., slow].abs().max().item()
    assert rel < 1e-5, rel
    assert rel_bf16 > 0.05, rel_bf16


class DowncastRecorder(TorchDispatchMode):
    """Records every operation that takes a float64 tensor and returns a narrower float one."""

    def __init__(self):
        super().__init__()
        self.downcasts: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.dtype == torch.float64 for t in ins) and any(
                t.is_floating_point() and t.dtype != torch.float64 for t in outs):
            self.downcasts.append(str(func))
        return out


@pytest.mark.parametrize("name", ALL)
@pytest.mark.slow
def test_float64_runs_stay_float64(name):
    """A float64 verification run (the SSD and Mamba-2 references, the cached-decoding checks) is
    computed in float64 throughout: no operation turns a float64 tensor into float32 (as a
    ``.float()`` would), in the forward, the backward or cached decoding."""
    torch.manual_seed(0)
    model = build_model(tiny_config(name)).double()
    idx = torch.randint(0, model.cfg.vocab_size, (2, 15))
    recorder = DowncastRecorder()
    with recorder:
        logits = model.eval()(idx).logits
        model.train()(idx).logits.sum().backward()
        with torch.no_grad():
            decoded = decode(model.eval(), idx, 3)
    assert not recorder.downcasts, f"{name}: float64 -> narrower in {sorted(set(recorder.downcasts))}"
    assert logits.dtype == decoded.dtype == torch.float64
    assert (decoded - logits).abs().max() < 1e-12


def test_gated_norm_twin_upcasts_before_gating():
    """mamba_ssm's ``rms_norm_ref`` and transformers' gated Mamba-2 norm upcast y and z to
    float32 before y * SiLU(z). The twin, fed bf16, equals transformers' module on the same bf16
    inputs (to bf16 rounding of the output) and equals the float32 computation rounded once."""
    from transformers.models.mamba2 import modeling_mamba2

    # transformers 5.x names it Mamba2RMSNormGated (MambaRMSNormGated before), the same module
    MambaRMSNormGated = getattr(modeling_mamba2, "Mamba2RMSNormGated", None) or modeling_mamba2.MambaRMSNormGated

    torch.manual_seed(0)
    dim, groups = 64, 4
    y = (torch.randn(3, 5, dim) * 3).to(torch.bfloat16)
    z = (torch.randn(3, 5, dim) * 3).to(torch.bfloat16)
    weight = torch.rand(dim) + 0.5
    for group_size in (dim, dim // groups):
        ref = MambaRMSNormGated(dim, group_size, eps=1e-5)
        with torch.no_grad():
            ref.weight.copy_(weight)
            ours = kernels.gated_rms_norm_ref(y, z, weight, group_size, 1e-5)
            # transformers rounds the normalised value to bf16 before the gain; compare in float32
            theirs = ref(y, z)
            exact = kernels.gated_rms_norm_ref(y.float(), z.float(), weight, group_size, 1e-5)
        assert ours.dtype == torch.bfloat16
        assert torch.equal(ours, exact.to(torch.bfloat16)), group_size  # the same float32 operators once upcast
        assert ((ours.float() - theirs.float()).abs() <= 2 * 2.0 ** -7 * theirs.float().abs() + 1e-6).all(), group_size
        # gating in bf16 first (the old twin) rounds y * SiLU(z) before the norm: not the reference
        gated_first = kernels.rms_norm((y * F.silu(z)).view(3, 5, -1, group_size).float(), None, 1e-5)
        gated_first = (weight * gated_first.view(3, 5, dim)).to(torch.bfloat16)
        assert not torch.equal(gated_first, exact.to(torch.bfloat16))
