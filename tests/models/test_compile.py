"""`train.compile: true` wraps the model in torch.compile (train/loop.py). A graph break in a
model's forward splits what the compiler sees; one inside a context manager that cannot hold it
makes Dynamo skip the whole frame and compile the loop's iterations one by one, each K anew, until
its recompile limit sends them back to eager (seen once: a training run of 4 steps took 35 s
compiled against 4 s eager). So every model's forward, training and evaluation, must trace into
one graph: compiled with ``fullgraph=True``, which raises at a graph break, and the "eager"
backend, which runs the traced graph as it is (no kernels are generated), so this costs seconds.

Parcae is left out: its sampled initial state calls ``nn.init.trunc_normal_``, which reads a
scalar (``Tensor.item``), and its evaluation state is seeded by token position, which needs the
positions as Python integers. Both break the graph by design."""

from __future__ import annotations

import warnings

import pytest
import torch

from stateloop.models.registry import MODELS, build_model
from support.models import tiny_config

TRACED = [name for name in MODELS if name != "parcae"]


@pytest.mark.parametrize("name", TRACED)
@pytest.mark.slow
def test_a_models_forward_is_one_graph_for_torch_compile(name):
    torch.manual_seed(0)
    model = build_model(tiny_config(name))
    idx = torch.randint(0, model.cfg.vocab_size, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    model.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(idx).logits.sum().backward()  # a training step's forward (and its backward)
    # Dynamo traces through a functools cache and warns that it may be silently wrong; none is traced
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message) for w in caught]
    model.eval()
    with torch.no_grad():  # validation and evaluation (train/loop.py, evaluate/perplexity.py)
        # bitwise: the eager backend calls the forward's own operators, in its order, in this process
        torch.testing.assert_close(compiled(idx).logits, model(idx).logits, rtol=0, atol=0)
