"""The training loss (train/loss.py): the reference path is today's computation, and the chunked one
(train.loss_chunk_tokens) equals it within float32 rounding for every registered model, without
ever making the logits of more than one chunk."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stateloop.models.registry import MODELS, build_model
from stateloop.train.loss import ChunkedCrossEntropy, lm_loss
from support.models import tiny_config

ALL = sorted(MODELS)
# float32 rounding of a mean over 38 tokens summed in another order, and of the gradients' sums
# over chunks: measured at most 4.8e-7 (loss) and 3.1e-7 of the largest gradient entry
RTOL, ATOL = 1e-5, 1e-6


def loss_and_gradients(name, chunk, targets=None, autocast=False):
    torch.manual_seed(0)
    model = build_model(tiny_config(name))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 20))
    y = idx[:, 1:] if targets is None else targets
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = lm_loss(model, idx[:, :-1], y, chunk)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_the_reference_path_is_the_cross_entropy_of_the_whole_logits():
    torch.manual_seed(0)
    model = build_model(tiny_config("stateloop"))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 20))
    want = F.cross_entropy(model(idx[:, :-1]).logits.float().flatten(0, 1), idx[:, 1:].flatten())
    assert torch.equal(lm_loss(model, idx[:, :-1], idx[:, 1:], 0), want)


@pytest.mark.parametrize("name", ALL)
def test_the_chunked_loss_and_gradients_equal_the_reference(name):
    """38 tokens in chunks of 7 (the last one 3 tokens), and in a single chunk."""
    loss, grads = loss_and_gradients(name, 0)
    for chunk in (7, 64):
        loss_c, grads_c = loss_and_gradients(name, chunk)
        torch.testing.assert_close(loss_c, loss, rtol=RTOL, atol=ATOL)
        for key in grads:
            torch.testing.assert_close(grads_c[key], grads[key], rtol=RTOL, atol=ATOL, msg=f"{name} {chunk} {key}")


def test_the_tolerance_tells_a_mean_of_chunk_means_from_the_mean():
    """The comparison is tight enough to catch the plausible mistake: the mean of the chunks' means
    (the last chunk of 3 tokens weighted as one of 7) is not the mean over the tokens."""
    torch.manual_seed(0)
    model = build_model(tiny_config("vanilla_looped"))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 20))
    logits = model(idx[:, :-1]).logits.flatten(0, 1)
    targets = idx[:, 1:].flatten()
    means = torch.stack([F.cross_entropy(lg, t) for lg, t in zip(logits.split(7), targets.split(7))]).mean()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(means, lm_loss(model, idx[:, :-1], idx[:, 1:], 7), rtol=RTOL, atol=ATOL)


def test_ignored_targets_count_in_neither():
    """Targets of -100 (F.cross_entropy's ignore_index) are left out of the sum and of the count."""
    torch.manual_seed(0)
    y = torch.randint(0, 97, (2, 19))
    y[0, :5] = -100
    y[1, 11] = -100
    loss, grads = loss_and_gradients("stateloop", 0, targets=y)
    loss_c, grads_c = loss_and_gradients("stateloop", 4, targets=y)
    torch.testing.assert_close(loss_c, loss, rtol=RTOL, atol=ATOL)
    for key in grads:
        torch.testing.assert_close(grads_c[key], grads[key], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["vanilla_looped", "stateloop_mamba2"])
def test_under_bf16_autocast_too(name):
    """As Fabric's bf16-mixed runs it: the head's matmul in bf16 either way, the loss in float32.
    The gradients agree to bf16's precision: W_o's gradient is the sum of the chunks' on autocast's
    bf16 copy of it (train/loss.py), the reference's one product rounded once (measured: one bf16 ulp
    of its largest entry, 2^-11 at 0.11, a few where chunks cancel); the rest within float32 noise."""
    loss, grads = loss_and_gradients(name, 0, autocast=True)
    loss_c, grads_c = loss_and_gradients(name, 7, autocast=True)
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    for key in grads:
        bf16 = 2.0**-7 * grads[key].abs().max().item()  # two bf16 ulps of the tensor's largest entry
        torch.testing.assert_close(grads_c[key], grads[key], rtol=2.0**-7, atol=bf16, msg=key)


@pytest.mark.parametrize("name", ["stateloop", "pause_token", "ponderlm"])
def test_no_logits_of_more_than_one_chunk_exist(name, monkeypatch):
    """Every output of the final head, in the forward and in backward's recomputation, holds at most
    one chunk's rows (PonderLM's pondering heads run inside its passes, on every position, as the
    model defines them; here only the final head, LoopedLM.lm_head called on Y, is checked)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(name))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 20))
    rows = []
    head = type(model).lm_head

    def recording(self, h):
        out = head(self, h)
        rows.append(out.shape[:-1].numel())
        return out

    call = ChunkedCrossEntropy.__call__

    def final_head_only(self, m, Y):
        monkeypatch.setattr(type(m), "lm_head", recording)
        return call(self, m, Y)

    monkeypatch.setattr(ChunkedCrossEntropy, "__call__", final_head_only)
    lm_loss(model, idx[:, :-1], idx[:, 1:], 5).backward()
    assert rows and max(rows) <= 5
    assert len(rows) == 2 * 8  # 38 tokens: 8 chunks, each in the forward and once more in backward
