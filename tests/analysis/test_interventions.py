"""Calibrated replacement and freezing (eq. 15): calibration by hand, the override plumbing
against the clean pass, and the state statistics against a direct computation."""

import math

import pytest
import torch

from stateloop.analysis.interventions import (
    StateStats,
    calibrate,
    exact_sums,
    freezing_overrides,
    intervention_nll,
    intervention_result,
    replacement_overrides,
    state_statistics,
)
from stateloop.evaluate.perplexity import mean_nll
from support.analysis import run_windows


def test_calibration_with_identical_statistics_is_the_identity_up_to_epsilon():
    """Eq. (15) divides by sigma + epsilon, epsilon = 1e-6 ("Here epsilon = 10^-6 ensures numerical
    stability"): with the same statistics on both sides, S moves by (S - mu) epsilon / (sigma + epsilon)."""
    S = torch.randn(3, 7, 5, dtype=torch.float64) * 4 + 2
    mu, sigma = torch.randn(5, dtype=torch.float64), torch.rand(5, dtype=torch.float64) * 1e-5 + 1e-6
    out = calibrate(S, mu, sigma, mu, sigma)
    assert torch.allclose(out, S - (S - mu) * 1e-6 / (sigma + 1e-6), rtol=0, atol=1e-12)
    assert not torch.allclose(out, S, atol=1e-3)  # a sigma of 1e-6..1e-5 makes epsilon visible: not max(sigma, eps)
    stats = StateStats(torch.randn(3, 5).double(), torch.rand(3, 5).double() + 0.1, 1)
    assert torch.allclose(stats.calibrate(S.float(), 2, 2), S.float(), atol=1e-4)
    # a channel that never varied in the calibration sample (sigma = 0): the paper's form, scale sigma_dst / epsilon
    flat = calibrate(S, mu, torch.zeros(5, dtype=torch.float64), mu + 1, torch.ones(5, dtype=torch.float64))
    assert torch.allclose(flat, 1e6 * (S - mu) + mu + 1)


def test_calibration_moves_each_channel_to_the_target_statistics():
    S = torch.randn(4000, 3, dtype=torch.float64) * torch.tensor([0.5, 2.0, 3.0]) + torch.tensor([1.0, -2.0, 0.0])
    mu_t, sd_t = torch.tensor([10.0, 0.0, -3.0]).double(), torch.tensor([1.0, 0.1, 5.0]).double()
    out = calibrate(S, S.mean(0), S.std(0, unbiased=False), mu_t, sd_t)
    assert torch.allclose(out.mean(0), mu_t, atol=1e-9) and torch.allclose(out.std(0, unbiased=False), sd_t, atol=1e-9)
    # Eq. (15) entry by hand.
    assert out[0, 1].item() == pytest.approx((S[0, 1] - S[:, 1].mean()).item() / (S[:, 1].std(unbiased=False).item() + 1e-6) * 0.1)


def test_state_statistics_match_a_direct_computation(tiny_run):
    run_dir, model = tiny_run
    windows = run_windows(run_dir, "val")
    stats = state_statistics(model, windows, batch_size=3, progress=False)
    with torch.no_grad():
        states = model(windows[:, :-1], return_states=True).states
    for k, S in enumerate(states):
        flat = S.reshape(-1, S.shape[-1]).double()
        # The statistics ran batches of 3 windows, this forward all 8 at once: float32 states whose last
        # bits may differ (by up to 2 ulps of the largest |S| under scalar kernels at 8 threads; equal bits
        # elsewhere). A mean or a population std moves by at most the largest change of one value, so
        # 8 such ulps bound both; an unbiased std, a lost batch or a miscount moves them by 1e-4 or more.
        tol = 8 * torch.finfo(torch.float32).eps * flat.abs().max().item()
        assert torch.allclose(stats.mean[k], flat.mean(0), rtol=0, atol=tol)
        assert torch.allclose(stats.std[k], flat.std(0, unbiased=False), rtol=0, atol=tol)
    assert stats.tokens == windows[:, :-1].numel()


def test_replacing_a_state_by_itself_leaves_the_nll_unchanged(tiny_run):
    run_dir, model = tiny_run
    windows = run_windows(run_dir, "test")
    K = model.cfg.K
    identities = {f"self_{i}": (lambda states, i=i: {i + 1: states[i]}) for i in range(K)}  # S^{i+1} <- S^{i+1}
    nll = intervention_nll(model, windows, identities, batch_size=4, progress=False)
    # The clean pass is the model's own (float32 sums per batch vs per window: 1e-6 relative).
    assert nll["none"] == pytest.approx(mean_nll(model, windows), rel=1e-6)
    for i in range(K):
        assert nll[f"self_{i}"] == nll["none"], i


def test_interventions_change_the_nll_and_freezing_at_k_minus_1_is_replacement(tiny_run):
    run_dir, model = tiny_run
    stats = state_statistics(model, run_windows(run_dir, "val"), batch_size=4, progress=False)  # calibrate, then evaluate
    res = intervention_result(model.cfg.K, exact_sums(model, run_windows(run_dir, "test"), stats, 4, progress=False), stats)
    K = model.cfg.K
    assert [e["i"] for e in res["replacement"]] == list(range(1, K)) == [e["i"] for e in res["freezing"]]
    assert res["freezing"][0]["boundaries"] == list(range(2, K + 1))
    assert res["freezing"][-1]["nll"] == pytest.approx(res["replacement"][-1]["nll"], abs=1e-12)
    assert any(abs(e["delta_nll"]) > 1e-4 for e in res["replacement"] + res["freezing"])
    assert res["unmodified"]["ppl"] == pytest.approx(math.exp(res["unmodified"]["nll"]))
    # The overrides are what eq. (15) says, on the states of the clean pass.
    S = [torch.randn(1, 2, model.cfg.d_s) for _ in range(K)]
    rep = replacement_overrides(S, stats, 1)
    assert list(rep) == [2] and torch.allclose(rep[2], stats.calibrate(S[0], 1, 2))
    frz = freezing_overrides(S, stats, 1)
    assert list(frz) == list(range(2, K + 1)) and torch.allclose(frz[K], stats.calibrate(S[0], 1, K))
