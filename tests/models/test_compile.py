"""`train.compile: true` compiles each model's units (train/compiling.py: every decoder layer and the
per-iteration branch, the units of checkpointing's ``layer`` level). Each unit must trace into one
graph: compiled here with ``fullgraph=True``, which raises at a graph break, and the "eager" backend,
which runs the traced graph as it is (no kernels are generated), so this costs seconds. Inductor
itself trains StateLoop under every strategy in tests/train/test_compile_train.py.

Every registered model, Parcae included: its sampled initial state (``Tensor.item``) and its
position-seeded evaluation state lie outside the units and run eager.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from stateloop.models.registry import MODELS, build_model
from stateloop.train.compiling import compile_units
from support.models import tiny_config


def _graphs_of_a_step(name: str, K: int) -> tuple[int, torch.nn.Module, torch.Tensor]:
    """Graphs compiled by one training forward + backward and one evaluation forward at depth K."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = build_model(dataclasses.replace(tiny_config(name), K=K))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16))
    torch._dynamo.reset()
    counters.clear()
    compile_units(model, backend="eager", fullgraph=True)
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(idx).logits.sum().backward()
    # Dynamo traces through a functools cache and warns that it may be silently wrong; none is traced
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    model.eval()
    with torch.no_grad():
        logits = model(idx).logits
    return int(counters["stats"]["unique_graphs"]), model, logits


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.slow
def test_a_models_units_compile_into_graphs_that_do_not_grow_with_K(name):
    """From K = 3 on every branch of a loop has been taken (S^0 = 0 and S^k; a first, middle and
    last iteration): K = 4 compiles no more graphs than K = 3."""
    graphs, model, logits = _graphs_of_a_step(name, K=3)
    assert graphs > 0
    graphs_4 = _graphs_of_a_step(name, K=4)[0]
    assert graphs_4 == graphs
    # bitwise: the eager backend calls the units' own operators, in their order, in this process
    fresh = build_model(model.cfg)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, fresh(idx).logits, rtol=0, atol=0)
    assert logits.shape[:2] == (2, 16)


def test_a_compiled_models_deep_copy_computes_with_its_own_weights():
    """The compiled units are the classes' functions bound to each module: a deep copy (perturbed
    here) computes with the copy's weights, as an uncompiled model with those weights does."""
    import copy

    torch.manual_seed(0)
    model = compile_units(build_model(tiny_config("stateloop")), backend="eager", fullgraph=True).eval()
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(0.1 * torch.randn_like(p))
    plain = build_model(twin.cfg).eval()
    plain.load_state_dict(twin.state_dict())
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(twin(idx).logits, plain(idx).logits, rtol=0, atol=0)
        assert not torch.equal(twin(idx).logits, model(idx).logits)
