"""The paper's baselines on the shared backbone: Hyperloop, MeSH, PonderLM, Parcae, Pause Token.

Each file implements one model as docs/baselines.md describes it (equations, shared
vs loop-specific parameters, init, decoding) and says in its docstring what the paper leaves
open and which choice is made. The registry (models/registry.py) maps the names ``hyperloop``,
``mesh``, ``ponderlm``, ``parcae`` and ``pause_token`` to these classes and their options.
"""

from stateloop.models.baselines.hyperloop import HyperloopLM, HyperloopOptions
from stateloop.models.baselines.mesh import MeshLM, MeshOptions
from stateloop.models.baselines.parcae import ParcaeLM, ParcaeOptions
from stateloop.models.baselines.pause_token import PauseTokenLM, PauseTokenOptions, expand_with_pauses
from stateloop.models.baselines.ponderlm import PonderLM, PonderLMOptions

__all__ = [
    "HyperloopLM", "HyperloopOptions", "MeshLM", "MeshOptions", "ParcaeLM", "ParcaeOptions",
    "PauseTokenLM", "PauseTokenOptions", "expand_with_pauses", "PonderLM", "PonderLMOptions",
]
