"""Exact Shapley values of the state reads: the game-theory core by hand, the prefix-shared
mask tree against separate masked forward passes, efficiency, and inert reads."""

import math

import pytest
import torch

from stateloop.analysis.shapley import exact_sums, keep_vector, masked_nll_sums, shapley_result, shapley_values
from support.analysis import make_run, run_windows


def test_shapley_values_by_hand():
    # Two players: phi_1 = (v1 + v12 - v2) / 2, phi_2 = (v2 + v12 - v1) / 2.
    v = [0.0, 3.0, 1.0, 10.0]  # bitmask order: {}, {1}, {2}, {1,2}
    assert shapley_values(v, 2) == pytest.approx([6.0, 4.0])
    # An additive game: every player's value is its own contribution.
    w = [5.0, 2.0, -1.0]
    additive = [sum(w[i] for i in range(3) if m >> i & 1) for m in range(8)]
    assert shapley_values(additive, 3) == pytest.approx(w)
    # Three players, v = |M|^2: symmetric, so each gets v(N) / 3.
    assert shapley_values([bin(m).count("1") ** 2 for m in range(8)], 3) == pytest.approx([3.0, 3.0, 3.0])
    with pytest.raises(ValueError, match="2\\^K"):
        shapley_values([0.0, 1.0], 2)


def test_mask_tree_equals_masked_forward_passes(tiny_run):
    """Every leaf of the prefix-shared tree equals the model's own forward pass with that
    read_mask, evaluated for all 2^K masks in one batch through the (B, K) form of the hook."""
    run_dir, model = tiny_run
    windows = run_windows(run_dir, "test")
    K = model.cfg.K
    tree = masked_nll_sums(model, windows, batch_size=4, progress=False)
    masks = torch.tensor([keep_vector(m, K) for m in range(2**K)])  # (2^K, K)
    with torch.no_grad():
        idx = windows[:, :-1].repeat_interleave(2**K, 0)  # window-major, mask-minor
        logits = model(idx, read_mask=masks.repeat(len(windows), 1)).logits
        nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), windows[:, 1:].repeat_interleave(2**K, 0).flatten(),
                                                reduction="none").view(len(windows), 2**K, -1)
    reference = nll.sum((0, 2)).double()
    assert torch.allclose(tree[:, 0], reference, rtol=1e-5)
    assert torch.all(tree[:, 1] == windows[:, 1:].numel())
    assert tree[:, 0].std() > 1e-3  # masks do change the NLL: the comparison is not vacuous


def test_efficiency_and_shares(tiny_run):
    run_dir, model = tiny_run
    res = shapley_result(model.cfg.K, exact_sums(model, run_windows(run_dir, "test"), 8, progress=False))
    assert sum(res["shapley"]) == pytest.approx(res["nll_all_masked"] - res["nll_none_masked"], abs=1e-9)
    assert sum(res["share_pct"]) == pytest.approx(100.0)
    assert res["feedback_share_pct"] + res["terminal_share_pct"] == pytest.approx(100.0)
    assert len(res["masks"]) == 2 ** model.cfg.K and res["masks"][0]["masked"] == [0] * model.cfg.K


@pytest.mark.parametrize("inert", ["terminal", "feedback"])
def test_inert_read_gets_zero(tmp_path, inert):
    """Zeroing W_{s->out} makes R_K = 0 whatever its mask; zeroing W_{s->z} does the same for
    every feedback read. Their Shapley values must be exactly zero, the others carry the total."""
    run_dir, model = make_run(tmp_path, K=4)
    with torch.no_grad():
        (model.W_sout if inert == "terminal" else model.W_sz).weight.zero_()
    res = shapley_result(model.cfg.K, exact_sums(model, run_windows(run_dir, "test"), 8, progress=False))
    phi, K = res["shapley"], model.cfg.K
    zero, live = ([K - 1], range(K - 1)) if inert == "terminal" else (range(K - 1), [K - 1])
    assert all(phi[i] == 0.0 for i in zero), phi
    assert sum(abs(phi[i]) for i in live) > 1e-4, phi
    assert math.isclose(sum(phi[i] for i in live), res["nll_all_masked"] - res["nll_none_masked"], abs_tol=1e-9)
