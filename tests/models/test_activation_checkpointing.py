"""Activation checkpointing (train.activation_checkpointing, applied by train/checkpointing.py) of
every registered model: the same
loss and gradients bit for bit, less memory kept for backward, units only in training forwards.

Equality is exact (torch.equal), not within a tolerance: in float32 on the CPU a checkpoint unit's
recomputation runs the same kernels on the same inputs as its forward did, so backward reads the
same saved floats and adds the gradients in the same order. A unit applied wrongly (a state cut at
its boundary, a random draw not replayed, a unit recomputing something else) moves them; the tests
at the end show the comparison catching such units."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import stateloop.train.checkpointing as checkpointing
from stateloop.models.backbone import Layer
from stateloop.models.cache import ModelCache
from stateloop.models.looped import StateLoopLM
from stateloop.models.registry import MODELS, build_model
from support.memory_probe import saved_bytes
from support.models import tiny_config

ALL = sorted(MODELS)
LEVELS = ("layer", "iteration")


def loss_and_gradients(name: str, level: str, **cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One training forward and backward of the tiny ``name`` model (the same weights and tokens
    every call; training mode, so Parcae draws its random h_0 from the same seed)."""
    torch.manual_seed(0)
    model = checkpointing.apply_checkpointing(build_model(tiny_config(name, **cfg)), level)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 20))
    torch.manual_seed(1)
    logits = model(idx[:, :-1]).logits
    loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def assert_same(name: str, level: str, **cfg) -> None:
    loss, grads = loss_and_gradients(name, "none", **cfg)
    loss_c, grads_c = loss_and_gradients(name, level, **cfg)
    assert torch.equal(loss, loss_c), (name, level, loss.item(), loss_c.item())
    assert grads.keys() == grads_c.keys()
    for key in grads:
        assert grads_c[key] is not None, (name, level, key)
        assert torch.equal(grads[key], grads_c[key]), (name, level, key, (grads[key] - grads_c[key]).abs().max().item())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ALL)
@pytest.mark.slow
def test_the_loss_and_every_gradient_are_those_without_checkpointing(name, level):
    assert_same(name, level)


@pytest.mark.parametrize("name", ALL)
def test_checkpointing_keeps_less_for_backward(name):
    """Bytes autograd saves (distinct storages, parameters excluded) in one training forward with
    the loss: fewer with every decoder layer a unit, fewer still with every iteration one (at two
    layers per stack, an iteration unit keeps one input where the layer units keep two)."""
    cfg = tiny_config(name)
    saved = {level: saved_bytes(cfg, batch=2, seq_len=16, precision="32-true", activation_checkpointing=level)
             for level in ("none", *LEVELS)}
    assert saved["iteration"] < saved["layer"] < saved["none"], saved


@pytest.mark.parametrize("level", LEVELS)
def test_a_random_draw_inside_a_unit_is_replayed_in_backward(level, monkeypatch):
    """No unit draws random numbers today (Parcae's h_0 is drawn before its loop); one that did
    (dropout in every decoder layer here) must draw the same numbers when backward recomputes it,
    or its gradients would not be those of the forward. torch's checkpoint restores the forward's
    RNG state for the recomputation, so they are."""
    forward = Layer.forward

    def with_dropout(self, x, rope, kv_cache=None):
        return F.dropout(forward(self, x, rope, kv_cache), p=0.3, training=True)

    monkeypatch.setattr(Layer, "forward", with_dropout)
    for name in ("vanilla_looped", "stateloop", "parcae"):
        assert_same(name, level)


def test_the_comparison_catches_a_unit_that_cuts_the_state(monkeypatch):
    """A unit that does not carry gradients through its inputs (as a checkpoint run under no_grad
    and re-attached would) cuts StateLoop's state and stream between iterations: the loss is the
    same, the gradients of the earlier iterations are not, and the comparison fails."""

    def cutting_checkpoint(fn, *args, use_reentrant):
        return fn(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args])

    monkeypatch.setattr(checkpointing, "checkpoint", cutting_checkpoint)
    with pytest.raises(AssertionError):
        assert_same("stateloop", "iteration")


def test_the_comparison_catches_a_unit_whose_recomputation_differs(monkeypatch):
    """A unit whose recomputation in backward does not remake what its forward saved (here: its
    input moved by 0.1% when recomputed, as a unit reading changed state would) gives other
    gradients, and the comparison fails."""
    real = checkpointing.checkpoint

    def drifting_checkpoint(inside, fn, x, *rest, use_reentrant):
        runs = []

        def drifting(x, *rest):
            runs.append(1)
            return fn(x if len(runs) == 1 else x * 1.001, *rest)
        return real(inside, drifting, x, *rest, use_reentrant=use_reentrant)

    monkeypatch.setattr(checkpointing, "checkpoint", drifting_checkpoint)
    with pytest.raises(AssertionError):
        assert_same("vanilla_looped", "layer")


def test_units_without_checkpointing_keep_as_much_as_the_reference(monkeypatch):
    """The memory test is not satisfied by anything: units that do not checkpoint keep exactly what
    the reference keeps."""
    cfg = tiny_config("stateloop")
    reference = saved_bytes(cfg, batch=2, seq_len=16, precision="32-true")
    monkeypatch.setattr(checkpointing, "checkpoint", lambda fn, *args, **kw: fn(*args))
    for level in LEVELS:
        assert saved_bytes(cfg, batch=2, seq_len=16, precision="32-true", activation_checkpointing=level) == reference


def test_the_state_branch_is_its_own_unit_under_layer_checkpointing(monkeypatch):
    """[choice] of StateLoopLM.checkpoint_units: with the state branch a unit of its own, "layer"
    keeps less than with only the decoder layers checkpointed, and the gradients stay exact either way."""
    cfg = tiny_config("stateloop_mamba2")
    with_branch = saved_bytes(cfg, batch=2, seq_len=16, precision="32-true", activation_checkpointing="layer")
    monkeypatch.setattr(StateLoopLM, "checkpoint_units", {"iteration": (StateLoopLM.step,)})  # the state branch left out
    without = saved_bytes(cfg, batch=2, seq_len=16, precision="32-true", activation_checkpointing="layer")
    assert_same("stateloop_mamba2", "layer")
    assert with_branch < without


@pytest.mark.parametrize("name", ["vanilla_looped", "stateloop_mamba2", "ponderlm", "pause_token"])
def test_units_are_live_only_in_a_forward_with_gradients_and_without_a_cache(name, monkeypatch):
    """No checkpoint runs under no_grad (validation, evaluation) or with a cache (decoding, even with
    gradients on: a recomputation would write the caches twice); cached decoding gives the logits of
    the full forward with the level set."""
    calls = []
    real = checkpointing.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpointing, "checkpoint", counting)
    model = checkpointing.apply_checkpointing(build_model(tiny_config(name)), "layer")
    idx = torch.randint(0, model.cfg.vocab_size, (1, 12))
    model(idx)
    assert calls, "a training forward checkpoints"
    calls.clear()
    model.eval()
    with torch.no_grad():
        full = model(idx).logits
    cache = ModelCache()
    with torch.enable_grad():
        parts = [model(idx[:, :5], cache=cache).logits] + [model(idx[:, t : t + 1], cache=cache).logits for t in range(5, 12)]
    assert not calls
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-4


def test_an_unknown_level_is_refused_in_one_line():
    from stateloop.config import ConfigError

    model = build_model(tiny_config("vanilla_looped"))
    with pytest.raises(ConfigError, match="train.activation_checkpointing"):
        checkpointing.apply_checkpointing(model, "layers")


def test_state_dict_keys_and_modules_stay_and_the_units_come_off():
    """The units wrap forwards in place: the state dict's keys are those of the bare model, and
    applying "none" (or another level) leaves the classes' forwards again."""
    model = build_model(tiny_config("stateloop"))
    keys = list(model.state_dict())
    for level in ("layer", "iteration"):
        checkpointing.apply_checkpointing(model, level)
        assert list(model.state_dict()) == keys
        assert checkpointing.checkpointing_level(model) == level
    checkpointing.apply_checkpointing(model, "none")
    assert not [m for m in model.modules() if "forward" in vars(m)] and "step" not in vars(model)
