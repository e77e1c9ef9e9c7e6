"""Greedy generation through the decoding cache equals greedy generation by recomputation,
for every registered model (baselines included once registered)."""

import pytest
import torch

from stateloop.models.generate import greedy_generate
from stateloop.models.registry import MODELS, build_model
from support.models import tiny_config


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_cached_equals_recomputed(name):
    model = build_model(tiny_config(name)).eval()
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 7))
    cached, cached_logits = greedy_generate(model, prompt, 10, use_cache=True, return_logits=True)
    recomputed, logits = greedy_generate(model, prompt, 10, use_cache=False, return_logits=True)
    assert cached.shape == (2, 10) and cached_logits.shape == (2, 10, model.cfg.vocab_size)
    # Tokens, not floats: the two paths' logits differ by < 1e-7 on every kernel path tried (AVX512,
    # AVX2, scalar, MKL at SSE4.2) while no step's top two logits are closer than 3e-5 (2026-12-05).
    assert torch.equal(cached, recomputed), name
    # The logits every choice was made from agree too (so equal tokens are not luck of the argmax).
    assert (cached_logits - logits).abs().max() < 1e-4, name
    assert torch.equal(logits.argmax(-1), recomputed)


def test_single_token_prompt_and_zero_tokens():
    model = build_model(tiny_config("stateloop_mamba2")).eval()
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 1))
    assert torch.equal(greedy_generate(model, prompt, 5), greedy_generate(model, prompt, 5, use_cache=False))
    assert greedy_generate(model, prompt, 0).shape == (1, 0)
    with pytest.raises(ValueError, match="prompt must have shape"):
        greedy_generate(model, prompt[0], 3)
