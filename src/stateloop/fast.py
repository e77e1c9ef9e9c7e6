"""Acceleration: a model's fused inference forms (models/fused.py), switched on and off from outside.

A module class with a fused twin declares it (``fused = False``, the class attribute its printed
form reads: models/fused.py); :func:`accelerate` sets it on every such module of a model, and
:func:`accelerated` for the duration of a block, like train/checkpointing.py's ``checkpointed``. The
switch is a plain attribute and the kept weights an ordinary one that a copy starts without, so an
accelerated model deep-copies, pickles (``torch.save``) and loads as any module, each copy computing
with its own parameters, and ``accelerate(model, False)`` undoes it; the parameters and state dict
never change. Forwards with gradients always take the printed forms.

Whoever builds or loads a model for inference accelerates it once (runs.load_run's callers,
evaluate/lm.load_run, the benchmarks); the analyses and the evaluator leave the model they are
handed as it is.
"""

from __future__ import annotations

import contextlib

import torch


def accelerate(model: torch.nn.Module, on: bool = True) -> torch.nn.Module:
    """``model`` with every fused form its modules declare switched ``on`` (False: off, the printed
    forms again). In place, idempotent; returns the model."""
    for m in model.modules():
        if hasattr(type(m), "fused"):
            m.fused = on
    return model


@contextlib.contextmanager
def accelerated(model: torch.nn.Module, on: bool = True):
    """``model`` with its fused forms ``on`` for the duration, then each module's setting before again."""
    before = [(m, m.fused) for m in model.modules() if hasattr(type(m), "fused")]
    accelerate(model, on)
    try:
        yield model
    finally:
        for m, was in before:
            m.fused = was
