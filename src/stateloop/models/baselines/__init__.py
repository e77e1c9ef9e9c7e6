"""The paper's baselines on the shared backbone: Hyperloop, MeSH, PonderLM, Parcae, Pause Token.

Each file implements one model as docs/baselines.md describes it (equations, shared
vs loop-specific parameters, init, decoding) and says in its docstring what the paper leaves
open and which choice is made; their options and config checks are in ``options.py`` (no torch).
The registry (models/registry.py) maps the names ``hyperloop``, ``mesh``, ``ponderlm``, ``parcae``
and ``pause_token`` to these classes. Importing the package loads no torch.
"""
