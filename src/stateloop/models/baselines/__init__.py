"""The paper's baselines on the shared backbone: Hyperloop, MeSH, PonderLM, Parcae, Pause Token.

Each file implements one model as docs/baselines.md describes it (equations, shared
vs loop-specific parameters, init, decoding) and says in its docstring what the paper leaves
open and which choice is made. The registry (models/registry.py) maps the names ``hyperloop``,
``mesh``, ``ponderlm``, ``parcae`` and ``pause_token`` to these classes and holds their options.
"""

from stateloop.models.baselines.hyperloop import HyperloopLM
from stateloop.models.baselines.mesh import MeshLM
from stateloop.models.baselines.parcae import ParcaeLM
from stateloop.models.baselines.pause_token import PauseTokenLM, expand_with_pauses
from stateloop.models.baselines.ponderlm import PonderLM

__all__ = ["HyperloopLM", "MeshLM", "ParcaeLM", "PauseTokenLM", "expand_with_pauses", "PonderLM"]
