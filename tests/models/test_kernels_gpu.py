"""Fused kernels against the pure-PyTorch twins (needs CUDA and the `gpu` extra; skipped on CPU)."""

import pytest
import torch

from stateloop.models import kernels

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.skipif(not kernels.HAS_FLASH_ATTN, reason="flash-attn not importable")
@pytest.mark.parametrize("Tq,Tk", [(128, 128), (1, 77), (16, 80)])
def test_flash_attention_matches_sdpa_bf16(Tq, Tk):
    q = torch.randn(2, Tq, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, Tk, 8, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, Tk, 8, 64, device="cuda", dtype=torch.bfloat16)
    ref = kernels.attention_ref(q.float(), k.float(), v.float())
    out = kernels.attention(q, k, v, impl="kernel").float()
    assert (out - ref).abs().max() < 2e-2


@cuda
@pytest.mark.skipif(not kernels.HAS_MAMBA_SSM, reason="mamba_ssm not importable")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 5e-3), (torch.bfloat16, 5e-2)])
def test_mamba_ssd_kernel_matches_torch(dtype, tol):
    """float32: mamba_ssm's Triton kernels call ``tl.dot`` without an input precision, which on
    Ampere and later multiplies float32 in TF32 (a 10-bit mantissa). On an H200 (2026-12-04) the
    kernel was 1.7e-3 of the largest output from a float64 twin here, the float32 twin 1e-6."""
    from stateloop.models.ssd import ssd_chunked

    b, l, h, p, g, n = 2, 300, 8, 64, 2, 128
    x = torch.randn(b, l, h, p, device="cuda", dtype=dtype)
    dt = torch.nn.functional.softplus(torch.randn(b, l, h, device="cuda")).to(dtype)
    A = -torch.rand(h, device="cuda") - 0.1
    B = torch.randn(b, l, g, n, device="cuda", dtype=dtype)
    C = torch.randn(b, l, g, n, device="cuda", dtype=dtype)
    ref = ssd_chunked(x.float(), dt.float(), A, B.float(), C.float(), 64)
    out = kernels.ssd(x, dt, A, B, C, 64, impl="kernel").float()
    assert ((out - ref).abs().max() / ref.abs().max()) < tol


def torch_and_kernel_models(name: str, mamba_d_state: int, device: str = "cuda"):
    """The same weights twice: the pure-PyTorch paths (``tiny_config``'s impl) and the fused kernels
    where they import (impl ``auto``)."""
    from stateloop.models.registry import build_model
    from support.models import tiny_config

    cfg = tiny_config(
        name,
        d_model=128,
        n_heads=2,
        head_dim=64,
        d_s=128,
        mixer_heads=2,
        mixer_head_dim=64,
        mamba_head_dim=64,
        mamba_d_state=mamba_d_state,
        mamba_n_groups=1,
        mamba_chunk_size=64,
    )
    torch.manual_seed(0)
    ref = build_model(cfg).to(device)
    fast = build_model(cfg.__class__(**{**cfg.__dict__, "attn_impl": "auto", "ssd_impl": "auto"})).to(device)
    fast.load_state_dict(ref.state_dict())
    return cfg, ref, fast


@cuda
@pytest.mark.parametrize("name", ["stateloop_attn", "stateloop_mamba2"])
def test_model_kernel_and_torch_paths_agree(name):
    cfg, ref, fast = torch_and_kernel_models(name, mamba_d_state=16)
    idx = torch.randint(0, cfg.vocab_size, (2, 100), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(idx).logits.float(), fast(idx).logits.float()
    assert (a - b).abs().max() < 5e-2


@cuda
@pytest.mark.skipif(not kernels.HAS_CAUSAL_CONV1D, reason="causal-conv1d not importable")
def test_conv_step_kernel_matches_torch_twin():
    """conv1d_step over 20 steps: causal-conv1d's update kernel against the twin."""
    torch.manual_seed(0)
    b, C, W = 2, 8 * 64 + 2 * 2 * 128, 4
    weight, bias = torch.randn(C, W, device="cuda") * 0.3, torch.randn(C, device="cuda")
    conv_k = torch.zeros(b, W - 1, C, device="cuda", dtype=torch.bfloat16)
    conv_t = torch.zeros(b, W - 1, C, device="cuda")
    for _ in range(20):
        xBC = torch.randn(b, C, device="cuda", dtype=torch.bfloat16)
        out_k, conv_k = kernels.conv1d_step(xBC, conv_k, weight.bfloat16(), bias.bfloat16(), impl="kernel")
        out_t, conv_t = kernels.conv1d_step(xBC.float(), conv_t, weight, bias, impl="torch")
        assert (out_k.float() - out_t).abs().max() < 5e-2


@cuda
@pytest.mark.skipif(not kernels.HAS_MAMBA_DECODE, reason="mamba_ssm not importable")
def test_mamba_decode_kernels_match_torch_twins():
    """ssd_decode_step and gated_rms_norm: mamba_ssm's Triton kernels against the twins (20 steps)."""
    torch.manual_seed(0)
    b, h, p, g, n = 2, 8, 64, 2, 128
    A, D, dt_bias = -torch.rand(h, device="cuda") * 4 - 0.1, torch.randn(h, device="cuda"), torch.randn(h, device="cuda")
    ssm_k, ssm_t = torch.zeros(b, h, p, n, device="cuda"), torch.zeros(b, h, p, n, device="cuda")
    for _ in range(20):
        x, Bm, Cm = torch.randn(b, h, p, device="cuda"), torch.randn(b, g, n, device="cuda"), torch.randn(b, g, n, device="cuda")
        dt = torch.randn(b, h, device="cuda", dtype=torch.bfloat16).float()
        args = (x, dt, A, Bm, Cm, D, dt_bias)
        y_k, ssm_k = kernels.ssd_decode_step(ssm_k, *args, impl="kernel")
        y_t, ssm_t = kernels.ssd_decode_step(ssm_t, *args, impl="torch")
        assert (y_k - y_t).abs().max() / y_t.abs().max() < 1e-3
        assert (ssm_k - ssm_t).abs().max() / ssm_t.abs().max() < 1e-3
    y, z = torch.randn(2, 2, 5, h * p, device="cuda")
    w = torch.rand(h * p, device="cuda") + 0.5
    for groups in (1, 4):
        ref = kernels.gated_rms_norm(y, z, w, h * p // groups, 1e-5, impl="torch")
        assert (kernels.gated_rms_norm(y, z, w, h * p // groups, 1e-5, impl="kernel") - ref).abs().max() < 1e-3


@cuda
@pytest.mark.parametrize("name", ["stateloop_attn", "stateloop_mamba2"])
def test_cached_decoding_kernel_and_torch_paths_agree(name):
    """Prefill + single-token decoding through flash-attn / the Mamba-2 decode kernels equals the
    pure-PyTorch path (fp32 weights, bf16 autocast as in the benchmark's GPU setting)."""
    from stateloop.models.cache import ModelCache

    cfg, ref, fast = torch_and_kernel_models(name, mamba_d_state=64)
    ref, fast = ref.eval(), fast.eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 40), device="cuda")
    outs = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for model in (ref, fast):
            cache = ModelCache()
            logits = [model(idx[:, :24], cache=cache).logits]
            logits += [model(idx[:, t : t + 1], cache=cache).logits for t in range(24, 40)]
            outs.append(torch.cat(logits, 1).float())
    assert (outs[0] - outs[1]).abs().max() < 5e-2
