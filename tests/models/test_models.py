"""Every registered model: forward/backward, gradients, causality, cached decoding; the backbone
against transformers' Llama."""

import pytest
import torch

from stateloop.models.cache import ModelCache
from stateloop.models.registry import MODELS, build_model
from support.models import tiny_config, to_transformers_llama

ALL = sorted(MODELS)


@pytest.mark.parametrize("name", ALL)
def test_forward_backward_every_parameter_gets_gradient(name):
    model = build_model(tiny_config(name))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 19))
    out = model(idx)
    assert out.logits.shape == (2, 19, model.cfg.vocab_size)
    torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0]
    assert not missing, f"{name}: no gradient for {missing}"


@pytest.mark.parametrize("name", ALL)
def test_causality(name):
    """Changing token t changes no logit before t (and does change the logit at t)."""
    model = build_model(tiny_config(name)).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (1, 17))
    t = 9
    idx2 = idx.clone()
    idx2[0, t] = (idx[0, t] + 1) % model.cfg.vocab_size
    with torch.no_grad():
        a, b = model(idx).logits, model(idx2).logits
    assert torch.equal(a[:, :t], b[:, :t]) or (a[:, :t] - b[:, :t]).abs().max() < 1e-6
    assert (a[:, t] - b[:, t]).abs().max() > 1e-4


@pytest.mark.parametrize("name", ALL)
def test_cached_decoding_equals_full_forward(name):
    model = build_model(tiny_config(name)).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (2, 23))
    with torch.no_grad():
        full = model(idx).logits
        for prompt in (1, 5, 12):
            cache = ModelCache()
            parts = [model(idx[:, :prompt], cache=cache).logits]
            parts += [model(idx[:, t : t + 1], cache=cache).logits for t in range(prompt, 20)]
            parts.append(model(idx[:, 20:], cache=cache).logits)  # a chunk of several tokens
            assert cache.seq_len == idx.shape[1]
            assert (torch.cat(parts, 1) - full).abs().max() < 1e-4, (name, prompt)


def test_k1_backbone_matches_transformers_llama():
    model = build_model(tiny_config("vanilla_looped", K=1, n_layers=3)).eval()
    hf = to_transformers_llama(model)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 31))
    with torch.no_grad():
        ours = model(idx).logits
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max() <= 1e-4


def test_looping_is_repeated_application_of_one_backbone():
    """K=3 vanilla looped equals applying the K=1 model's backbone three times by hand."""
    model = build_model(tiny_config("vanilla_looped", K=3)).eval()
    idx = torch.randint(0, model.cfg.vocab_size, (1, 11))
    with torch.no_grad():
        h = model.embed(idx) * model.cfg.d_model**0.5
        rope = model.rotary(11, None, idx.device, h.dtype)
        for _ in range(3):
            for layer in model.backbone.layers:
                h = layer(h, rope)
        manual = model.head(model.norm_f(h))
        assert (model(idx).logits - manual).abs().max() < 1e-5


def test_unknown_model_and_options_fail_with_the_key():
    from stateloop.config import ConfigError

    with pytest.raises(ConfigError, match="unknown model 'stateloop_xl'"):
        build_model(tiny_config("vanilla_looped").__class__(name="stateloop_xl"))
    with pytest.raises(ConfigError, match="model.options.width"):
        build_model(tiny_config("vanilla_looped", options={"width": 3}))
    with pytest.raises(ConfigError, match="model.options.d_fff"):
        build_model(tiny_config("vanilla_looped_ffn", options={"d_fff": 3}))


@pytest.mark.parametrize("name", [n for n in ALL if MODELS[n].has_state])
def test_the_state_width_is_refused_before_a_build(name):
    """d_s is checked once, by the registry, before any module is made: every model with a state
    refuses d_s = 0, and state only ("X^k in R^{n x d} has the backbone width") any d_s != d."""
    from stateloop.config import ConfigError

    with pytest.raises(ConfigError, match=r"model\.d_s: .*positive state width"):
        build_model(tiny_config(name, d_s=0), device="meta")
    if name == "state_only":
        with pytest.raises(ConfigError, match=r"model\.d_s: state_only keeps the state at the model width d=32, got 16"):
            build_model(tiny_config(name, d_s=16), device="meta")
