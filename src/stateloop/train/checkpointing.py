"""Activation checkpointing (``train.activation_checkpointing``), applied to a built model from outside.

Units (torch.utils.checkpoint, non-reentrant): ``"layer"``, every ``backbone.Layer`` application;
``"iteration"``, every ``backbone.Backbone`` application; at either level, the methods the model's
class declares as units of that level (``LoopedLM.checkpoint_units``: StateLoop's state branch
under "layer", each model's iteration under "iteration"). Units run only in training forwards and never nest, so loss and gradients
match, bit for bit (tests/models/test_activation_checkpointing.py). Forwards are wrapped as instance
attributes, not ``checkpoint_wrapper``, so state-dict keys and FSDP's units stay unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch
from torch.utils.checkpoint import checkpoint

from stateloop.config import ConfigError
from stateloop.config.train import CHECKPOINTING
from stateloop.models.backbone import Backbone, Layer

UNITS = {"layer": Layer, "iteration": Backbone}  # level -> the module class whose every application is a unit

_APPLIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its _Units


def units(model: torch.nn.Module, level: str) -> list[tuple[torch.nn.Module, str]]:
    """(owner, method name) of every unit of ``level`` in ``model``: each application of the level's
    module class, then the methods the model's class declares for it (``checkpoint_units``)."""
    found = [(module, "forward") for module in model.modules() if isinstance(module, UNITS[level])]
    return found + [(model, method.__name__) for method in getattr(type(model), "checkpoint_units", {}).get(level, ())]


class _Units:
    """The units of one model at one level, and whether the running forward checkpoints them."""

    def __init__(self, model: torch.nn.Module, level: str) -> None:
        self.level, self.live, self.inside = level, False, False
        self.wrapped: list[tuple[object, str, object]] = []  # (owner, name, the instance attribute before)
        for owner, name in units(model, level):
            self._wrap(owner, name)
        self.hooks = [model.register_forward_pre_hook(self._start, with_kwargs=True),
                      model.register_forward_hook(self._end)]

    def _wrap(self, owner, name: str) -> None:
        self.wrapped.append((owner, name, vars(owner).get(name)))
        setattr(owner, name, functools.partial(self.run, getattr(owner, name)))

    def _start(self, model, args, kwargs) -> None:
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        self.live = cache is None and torch.is_grad_enabled()  # training forwards only

    def _end(self, model, args, output) -> None:
        self.live = False

    def run(self, fn, *args, **kwargs):
        if self.inside or not (self.live and torch.is_grad_enabled()):
            return fn(*args, **kwargs)
        return checkpoint(self._inside, fn, *args, use_reentrant=False, **kwargs)

    def _inside(self, fn, *args, **kwargs):
        self.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            self.inside = False

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        for owner, name, before in reversed(self.wrapped):
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)


def apply_checkpointing(model: torch.nn.Module, level: str) -> torch.nn.Module:
    """Make ``model``'s units of ``level`` checkpoint in training forwards, replacing any level
    applied before; returns the model. Apply it before FSDP."""
    if level not in CHECKPOINTING:
        raise ConfigError(f"train.activation_checkpointing: must be one of {', '.join(CHECKPOINTING)}; got {level!r}")
    old = _APPLIED.pop(model, None)
    if old is not None:
        old.remove()
    if level != "none":
        _APPLIED[model] = _Units(model, level)
    return model


def checkpointing_level(model: torch.nn.Module) -> str:
    units = _APPLIED.get(model)
    return "none" if units is None else units.level


@contextlib.contextmanager
def checkpointed(model: torch.nn.Module, level: str):
    """``model`` with the units of ``level`` for the duration, then its units before again."""
    before = checkpointing_level(model)
    apply_checkpointing(model, level)
    try:
        yield model
    finally:
        apply_checkpointing(model, before)
