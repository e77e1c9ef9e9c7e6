"""Pieces shared by the baselines: layer splits and named stacks with their own KV caches.

The prelude / core / coda baselines (MeSH, Parcae) and Hyperloop's begin / middle / end blocks
keep their *shared* (looped) stack in ``LoopedLM.backbone``, so ``apply_backbone(h, rope, cache,
k)`` is application k of the looped stack with the caches of that application, exactly as for
Vanilla Looped. Their unique stacks are extra :class:`Backbone` modules applied once per token
through ``LoopedLM.apply_stack``, each with its own per-layer caches under its own key.
"""

from __future__ import annotations

from stateloop.models.backbone import Backbone
from stateloop.models.baselines.options import PRELUDE_CORE_CODA, resolve_split
from stateloop.models.looped import LoopedLM


class StackedLM(LoopedLM):
    """LoopedLM whose ``backbone`` is the looped stack, plus unique stacks applied once."""

    def unique_stack(self, n_layers: int) -> Backbone:
        return Backbone.from_config(self.cfg, n_layers=n_layers)


class PreludeCoreCodaLM(StackedLM):
    """Unique prelude -> shared core (``self.backbone``) applied K times -> unique coda: the
    skeleton MeSH and Parcae share (their options carry n_prelude, n_core, n_coda)."""

    def __init__(self, cfg, opts, model: str):
        n_prelude, n_core, n_coda = resolve_split(cfg, opts, PRELUDE_CORE_CODA, (1, 1, 1), model)
        super().__init__(cfg, n_layers=n_core)
        self.opts = opts
        self.n_prelude, self.n_core, self.n_coda = n_prelude, n_core, n_coda
        self.prelude = self.unique_stack(n_prelude)
        self.coda = self.unique_stack(n_coda)

    @property
    def n_layer_applications(self) -> int:
        return self.n_prelude + self.cfg.K * self.n_core + self.n_coda
