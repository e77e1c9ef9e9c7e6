"""The decoding pieces, and the fused inference forms (models/fused.py), each against its plain
definition."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from stateloop.fast import accelerate
from stateloop.models import fused
from stateloop.models.backbone import Attention, Rotary
from stateloop.models.cache import KVCache, ModelCache
from stateloop.models.fused import Derived
from stateloop.models.mixers import Mamba2, Mamba2Cache
from stateloop.models.registry import build_model
from stateloop.models.state import SelectiveStateCell
from support.models import tiny_config


def test_state_cell_is_eq6_by_hand():
    cell = SelectiveStateCell(12, 6)
    cell.reset_parameters(0.3)
    torch.nn.init.normal_(cell.W_delta.weight, std=0.3)  # input-dependent step sizes
    H, S = torch.randn(2, 5, 12), torch.randn(2, 5, 6)  # H^k, S^k
    U = H * torch.rsqrt(H.pow(2).mean(-1, keepdim=True) + 1e-5)  # RMSNorm_h with unit gain (2)
    P = U @ cell.W_u.weight.T  # (5)
    delta = torch.log1p(torch.exp(U @ cell.W_delta.weight.T + cell.b_delta))  # softplus
    g = torch.exp(-delta * torch.exp(cell.A_log))
    with torch.no_grad():
        assert torch.allclose(cell(S, H), g * S + (1 - g) * P, atol=1e-6)  # S^{k+1}, (6)
        assert torch.allclose(cell(None, H), (1 - g) * P, atol=1e-6)  # S^0 = 0


def test_mamba2_decode_steps_equal_full_forward():
    m = Mamba2(16, 2, 4, 4, 8, 2, 4, impl="torch")
    m.reset_parameters(0.2)
    u = torch.randn(2, 9, 16)
    cache = Mamba2Cache()
    with torch.no_grad():
        full = m(u)
        steps = torch.cat([m(u[:, t : t + 1], cache) for t in range(9)], 1)  # from the very first token
    assert (steps - full).abs().max() < 1e-5


def test_kv_cache_grows_past_its_capacity():
    cache = KVCache(capacity=3)
    ks, vs = [], []
    for T in (2, 1, 4, 1, 7):
        k, v = torch.randn(1, T, 2, 4), torch.randn(1, T, 2, 4)
        ks.append(k)
        vs.append(v)
        k_all, v_all = cache.update(k, v)
        assert torch.equal(k_all, torch.cat(ks, 1)) and torch.equal(v_all, torch.cat(vs, 1))
    assert len(cache) == 15 and torch.equal(cache.k, torch.cat(ks, 1))


def _rotate_half_by_hand(x, cos, sin):
    """RoPE as LLaMA writes it: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
    D = x.shape[-1]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def test_rope_is_rotate_half_to_the_last_bit():
    """Rotary.apply is rotate-half on its tables, to the last bit, and the tables hold the angles
    position / theta^(2i / D)."""
    torch.manual_seed(0)
    for head_dim, offset in ((8, 0), (16, 37)):
        rope = Rotary(5, offset, head_dim, 10000.0, "cpu", torch.float32)
        for r in (rope, rope.for_head_dim(head_dim // 2)):
            D = r.head_dim
            angles = r.positions.double()[:, None] / 10000.0 ** (torch.arange(0, D, 2).double() / D)
            torch.testing.assert_close(r.cos, torch.cat([angles, angles], -1).cos().float())
            torch.testing.assert_close(r.sin, torch.cat([angles, angles], -1).sin().float())
            x = torch.randn(2, 5, 3, D)
            # bitwise on any machine: both are elementwise products and a sum, each correctly rounded
            assert torch.equal(r.apply(x), _rotate_half_by_hand(x, r.cos, r.sin))
            assert torch.equal(fused.rotate(r, x), r.apply(x))  # the inference form: the sign on the table


def test_fused_attention_equals_the_printed_forward_after_every_weight_change():
    """Accelerated (fast.accelerate), attention without gradients takes one product with
    [W_q; W_k; W_v], kept between calls: it must equal the printed forward's three products to
    float32's rounding (1e-6 absolute here), and follow in-place updates (an optimizer step, a
    checkpoint load) and casts."""
    torch.manual_seed(0)
    att = accelerate(Attention(16, 2, 8, impl="torch"))
    x = torch.randn(2, 5, 16)
    rope = Rotary(5, 0, 8, 10000.0, "cpu", torch.float32)
    for _ in range(3):
        trained = att(x, rope)
        assert trained.requires_grad
        with torch.no_grad():
            torch.testing.assert_close(att(x, rope), trained.detach(), rtol=0, atol=1e-6)
        with torch.inference_mode():
            torch.testing.assert_close(att(x, rope), trained.detach(), rtol=0, atol=1e-6)
        with torch.no_grad():
            for W in (att.wq, att.wk, att.wv):
                W.weight.add_(0.1 * torch.randn_like(W.weight))  # in place, as an optimizer step
    att.double()
    x, rope = x.double(), Rotary(5, 0, 8, 10000.0, "cpu", torch.float64)
    trained = att(x, rope)
    with torch.no_grad():
        out = att(x, rope)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, trained.detach(), rtol=0, atol=1e-12)


def test_derived_weights_follow_in_place_changes_and_casts():
    """fused.Derived keeps its tensor while the parameters stay, and remakes it after an in-place
    change (an optimizer step, a checkpoint load) or a cast."""
    lin = torch.nn.Linear(4, 4)
    derived = Derived()
    get = lambda: derived.get((lin.weight,), lambda: lin.weight * 2)  # noqa: E731
    with torch.no_grad():
        first = get()
        assert get() is first
        lin.weight.add_(1.0)
        torch.testing.assert_close(get(), lin.weight * 2, rtol=0, atol=0)
    lin.double()
    assert get().dtype == torch.float64


@pytest.mark.parametrize("name", ["stateloop_attn", "stateloop_mamba2"])
def test_accelerated_decoding_gives_the_printed_forwards_tokens(name):
    """The same greedy tokens, and logits to float32's rounding, from an accelerated model as from
    the printed forwards, with the decoding cache (the attention and cell forms; Mamba-2's A made once)."""
    from stateloop.models.generate import greedy_generate

    torch.manual_seed(0)
    model = build_model(tiny_config(name)).eval()
    prompt = torch.arange(5)[None]
    plain, plain_logits = greedy_generate(model, prompt, 6, return_logits=True)
    fused, fused_logits = greedy_generate(accelerate(model), prompt, 6, return_logits=True)
    assert torch.equal(plain, fused)
    torch.testing.assert_close(fused_logits, plain_logits, rtol=1e-5, atol=1e-5)


class _Ops(TorchDispatchMode):
    """The aten operators dispatched inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _decoded_token_ops(model) -> list[str]:
    cache = ModelCache()
    with torch.inference_mode():
        model(torch.randint(0, model.cfg.vocab_size, (1, 5)), cache=cache)
        with _Ops() as ops:
            model(torch.tensor([[3]]), cache=cache)
    return [op for op in ops.names if "promote_types" not in op]  # a dtype rule, no tensor work


def test_a_bf16_state_branch_casts_only_what_its_float32_state_needs():
    """Eq. (6), "S~^{k+1} = exp(-lambda . Delta^k) . S^k + (1 - exp(-lambda . Delta^k)) . P^k" with
    "Delta^k = softplus(U^k W_Delta^T + b_Delta), lambda = exp(A_log)" (paper, Sec. 3; the fused
    form evaluates it as lerp(P^k, S^k, g^k), the same map). The paper is silent on precision:
    models/state.py keeps S^k in float32 in a model cast to bf16. A decoded iteration of an
    accelerated StateLoop's branch then dispatches the float32 model's operators and three casts: the fused
    product's output into the state's dtype (P^k and Delta^k's pre-activation together, one cast),
    RMSNorm_s's gain to float32 and the read N^{k+1} back to bf16 for W_{s->z} (``promote_types``
    not counted: it does no tensor work). The cell's floats
    are eq. (6) on the bf16 product cast once to float32."""
    branch, K = {}, tiny_config("stateloop").K
    for dtype in (torch.float32, torch.bfloat16):
        ops = {}
        for name in ("vanilla_looped", "stateloop", "stateloop_attn", "stateloop_mamba2"):
            torch.manual_seed(0)
            model = accelerate(build_model(tiny_config(name)).eval().to(dtype))
            ops[name] = _decoded_token_ops(model)
        branch[dtype] = (len(ops["stateloop"]) - len(ops["vanilla_looped"])) / K
    assert branch[torch.bfloat16] - branch[torch.float32] == 3, branch

    torch.manual_seed(0)
    cell = SelectiveStateCell(12, 6)
    cell.reset_parameters(0.3)
    torch.nn.init.normal_(cell.W_delta.weight, std=0.3)
    accelerate(cell.to(torch.bfloat16))
    H, S = torch.randn(2, 5, 12).to(torch.bfloat16), torch.randn(2, 5, 6)
    with torch.inference_mode():
        U = torch.nn.functional.rms_norm(H, (12,), cell.norm_h.weight, 1e-5)  # (2), in bf16
        # (5) and Delta^k's pre-activation: one bf16 product with [W_u; W_Delta], cast to float32
        W, b = torch.cat([cell.W_u.weight, cell.W_delta.weight]), torch.cat([torch.zeros_like(cell.b_delta), cell.b_delta])
        P, pre = torch.nn.functional.linear(U, W, b).float().split(6, dim=-1)
        g = torch.exp(-torch.nn.functional.softplus(pre) * torch.exp(cell.A_log.float()))
        out = cell(S, H)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.lerp(P, S, g))  # (6): g S^k + (1 - g) P^k, by the cell's own operators in its order
