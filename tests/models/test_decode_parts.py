"""The pieces the decode path was optimised with, each against its plain definition."""

import torch

from stateloop.models.cache import KVCache
from stateloop.models.mixers import Mamba2, Mamba2Cache
from stateloop.models.state import SelectiveStateCell


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
