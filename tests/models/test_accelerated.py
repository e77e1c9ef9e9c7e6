"""An accelerated model (stateloop/fast.py) is an ordinary module, for every registered model: a deep
copy computes with its own parameters, ``torch.save`` / ``torch.load`` round-trips it, and
``accelerate(model, False)`` undoes it to the printed forms bit for bit. The analyses and the
evaluator leave the model they are handed as it is (their callers accelerate once)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from stateloop.analysis.interventions import intervention_nll
from stateloop.analysis.shapley import mask_tree
from stateloop.fast import accelerate, accelerated
from stateloop.models.registry import MODELS, build_model
from support.models import tiny_config


def switches(model) -> set[bool]:
    """The settings of every fused form the model's modules declare."""
    return {m.fused for m in model.modules() if hasattr(type(m), "fused")}


def logits(model, idx):
    with torch.no_grad():
        return model(idx).logits


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_accelerated_copy_follows_its_own_parameters(name):
    torch.manual_seed(0)
    model = accelerate(build_model(tiny_config(name)).eval())
    assert switches(model) == {True}  # every model has at least the backbone's attention
    idx = torch.randint(0, 97, (2, 9))
    original = logits(model, idx)  # the kept fused weights are made from the original's parameters here
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.25)
    assert switches(twin) == {True}
    ours = logits(twin, idx)
    with accelerated(twin, False):
        printed = logits(twin, idx)
    torch.testing.assert_close(ours, printed, rtol=1e-5, atol=1e-5)  # the copy's own weights, fused
    assert (ours - original).abs().max() > 1e-2, name  # ... which are not the original's
    assert switches(twin) == {True}  # the block set them back
    assert torch.equal(logits(model, idx), original)  # the original untouched


@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_accelerated_model_saves_loads_and_undoes(name, tmp_path):
    torch.manual_seed(0)
    plain = build_model(tiny_config(name)).eval()
    idx = torch.randint(0, 97, (2, 9))
    reference = logits(plain, idx)
    model = accelerate(copy.deepcopy(plain))
    fused = logits(model, idx)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert switches(loaded) == {True}
    assert torch.equal(logits(loaded, idx), fused)
    assert list(loaded.state_dict()) == list(plain.state_dict())
    accelerate(model, False)
    assert switches(model) == {False}
    assert torch.equal(logits(model, idx), reference)  # the printed forms, bit for bit


def test_the_analyses_and_the_evaluator_leave_the_model_as_handed():
    from stateloop.evaluate.lm import StateLoopEvalLM

    model = build_model(tiny_config("stateloop")).eval()
    windows = torch.randint(0, 97, (2, 8))
    with torch.no_grad():
        list(mask_tree(model, windows[:, :-1], windows[:, 1:]))
    intervention_nll(model, windows, {}, progress=False)
    StateLoopEvalLM(model=model, tokenizer=SimpleNamespace(get_vocab_size=lambda: 97), eos_id=0, device="cpu")
    assert switches(model) == {False}
