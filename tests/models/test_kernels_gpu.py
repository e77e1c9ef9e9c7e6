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
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 5e-2)])
def test_mamba_ssd_kernel_matches_torch(dtype, tol):
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


@cuda
@pytest.mark.parametrize("name", ["stateloop_attn", "stateloop_mamba2"])
def test_model_kernel_and_torch_paths_agree(name):
    from helpers import tiny_config
    from stateloop.models.registry import build_model

    cfg = tiny_config(name, d_model=128, n_heads=2, head_dim=64, d_state=128, mixer_heads=2, mixer_head_dim=64,
                      mamba_head_dim=64, mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=64)
    torch.manual_seed(0)
    ref = build_model(cfg).cuda()
    fast = build_model(cfg.__class__(**{**cfg.__dict__, "attn_impl": "auto", "ssd_impl": "auto"})).cuda()
    fast.load_state_dict(ref.state_dict())
    idx = torch.randint(0, cfg.vocab_size, (2, 100), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(idx).logits.float(), fast(idx).logits.float()
    assert (a - b).abs().max() < 5e-2
