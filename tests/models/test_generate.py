"""Greedy generation through the decoding cache equals greedy generation by recomputation,
for every registered model (baselines included once registered)."""

import pytest
import torch

from helpers import tiny_config
from stateloop.models.generate import greedy_generate
from stateloop.models.registry import MODELS, build_model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_cached_equals_recomputed(name):
    # A larger init scale gives peaked logits, so greedy choices are far from ties and a wrong
    # cache shows up as a different token rather than hiding under rounding.
    model = build_model(tiny_config(name, init_std=0.2)).eval()
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 7))
    cached = greedy_generate(model, prompt, 12, use_cache=True)
    recomputed = greedy_generate(model, prompt, 12, use_cache=False)
    assert cached.shape == (2, 12)
    assert torch.equal(cached, recomputed), name
    # Not a degenerate model that repeats one token: the test would then prove little.
    assert len(torch.unique(recomputed)) > 1, name


def test_single_token_prompt_and_zero_tokens():
    model = build_model(tiny_config("stateloop_mamba2", init_std=0.2)).eval()
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 1))
    assert torch.equal(greedy_generate(model, prompt, 5), greedy_generate(model, prompt, 5, use_cache=False))
    assert greedy_generate(model, prompt, 0).shape == (1, 0)
    with pytest.raises(ValueError, match="prompt must have shape"):
        greedy_generate(model, prompt[0], 3)
