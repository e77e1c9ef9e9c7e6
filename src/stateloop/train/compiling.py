"""``train.compile``: torch.compile applied to a built model's units from outside, as torchtitan does.

[choice] The unit of compilation is the unit of ``activation_checkpointing: layer``
(train/checkpointing.py): every decoder ``Layer``'s forward and the methods the model's class
declares as ``layer`` units (``checkpoint_units``: StateLoop's state branch ``update``, PonderLM's
``ponder``). Not the whole model, because:

- a looped layer compiles once for all its K applications and for every layer of the stack (the
  graph takes the parameters as inputs; torch >= 2.5 does not guard on a module's identity), so
  compile time does not grow with K or depth, and the K loop itself never recompiles;
- under FSDP2 Dynamo does not trace a ``fully_shard`` unit's hooks: a whole-model graph breaks at
  every decoder layer, and the pieces between them (the loop body) recompile for each k
  (``k == 0`` guards) until the recompile limit sends them back to eager. Per unit, the FSDP and
  DDP hooks and the K loop stay eager around compiled layers, the same under every strategy;
- activation checkpointing wraps the compiled unit from outside (checkpoint(compiled forward)):
  its recomputation runs the same compiled graph, so gradients match bit for bit;
- what Dynamo cannot trace (Parcae's sampled initial state: ``Tensor.item``; position-seeded
  evaluation state) is outside every unit and runs eager; Parcae's layers compile like the others.

[choice] ``dynamic=False``: every distinct input shape gets its own static graph, never a
dynamic one. Training's shapes are fixed; validation's last micro-batch may be smaller, which adds
one graph per unit. Automatic dynamic shapes would instead swap the training step onto a
dynamic-shape graph after the first short validation batch (other kernels, other roundings), so a
run resumed before that point would not equal the uninterrupted one bit for bit.

[choice] ``fullgraph=False`` in training: a graph break (on a GPU, a fused kernel Dynamo does
not trace) costs speed, not the run; :func:`compile_counts` reports them in train.json. The CPU
tests compile every model's units with ``fullgraph=True`` (tests/models/test_compile.py).

Graphs per unit (tests/train/test_compile_train.py): a Layer 1 per input shape and grad mode
(training; validation), StateLoop's ``update`` 2 per shape and grad mode (S^0 = 0, passed as None,
and S^k), independent of K and of the number of steps or validations.
"""

from __future__ import annotations

import types

import torch

from stateloop.train.checkpointing import units


def compile_units(model: torch.nn.Module, backend: str = "inductor", fullgraph: bool = False) -> torch.nn.Module:
    """Compile ``model``'s units (module docstring) in place: each unit's method becomes its class's
    function, compiled once per class, bound to the unit as an instance attribute. Parameters,
    state-dict keys and module hooks (FSDP's, DDP's, the checkpoint units') are unchanged, and a
    deep copy computes with its own weights (the bound method is copied with its module). Apply it
    before activation checkpointing and FSDP; returns the model."""
    for owner, name in units(model, "layer"):
        key = (getattr(type(owner), name), backend, fullgraph)
        if key not in _COMPILED:
            _COMPILED[key] = torch.compile(key[0], backend=backend, fullgraph=fullgraph, dynamic=False)
        setattr(owner, name, types.MethodType(_COMPILED[key], owner))
    return model


_COMPILED: dict = {}  # (a class's function, backend, fullgraph) -> its compiled form, shared by every instance


def compile_counts() -> dict:
    """What this process compiled so far (train.json's ``compile``): graphs, graph breaks, seconds."""
    from torch._dynamo.utils import calculate_time_spent, counters

    seconds = calculate_time_spent()
    return {"graphs": int(counters["stats"]["unique_graphs"]), "graph_breaks": int(sum(counters["graph_break"].values())),
            "compile_s": round(float(seconds.get("entire_frame_compile", 0.0)), 3)}
