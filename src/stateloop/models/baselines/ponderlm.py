"""PonderLM (Zeng et al., ICLR 2026): pondering with the model's own predicted distribution.

The full backbone T is run K times per token (K = s + 1 with s pondering steps; s = 3 at K = 4).
Between passes the predicted distribution becomes a "pondering embedding", the probability-
weighted sum of the *input* embeddings, which is added to the input of the next pass:

    c     = sqrt(d)  (scale_embeds)  or 1
    z^0   = s c E[x]        (multiply_pondering_steps; z^0 = c E[x] otherwise)
    for j = 0..s-1:
        p       = softmax(W_o RMSNorm_f(T(z^j)))     over the whole vocabulary, temperature 1
        z^{j+1} = z^j + c p E                          (p E: (B, T, V) @ (V, d))
    logits = W_o RMSNorm_f(T(z^s))

Every pass uses the same T, RMSNorm_f, W_o and E: no new parameters (1420.92M at 1.4B).
Gradients flow through every pass and through the soft embeddings (nothing is detached). The
loss is plain next-token CE on the final logits.

Decoding: pass j at position t depends only on pass-j states at positions <= t and on z^j_t,
so each pass keeps its own KV caches (key ("T", j), one per layer): a new chunk runs pass 0 with
cache 0, feeds its distribution into pass 1 with cache 1, and so on (K x L layer caches). The
official code has no incremental decoding (it recomputes every pass over the whole sequence).

What the paper leaves open, and the choices made here:
- [assume] "K iterations" = s + 1 backbone passes with s = K - 1 pondering steps (our reading
  of K = 4: three pondering steps, then the final pass; docs/baselines.md#ponderlm).
- [code] sqrt(d) embedding scale and the x s multiplier of z^0 follow the official 1.4B Pile
  recipe (``scale_embeds``, ``mutiply_pondering_steps``); both are options. With s = 0 (K = 1)
  there is nothing to multiply and z^0 = c E[x].
- [assume] The backbone init is the shared one (``model.init_scheme``: residual outputs scaled by
  sqrt(2 K L), the NeoX recipe's unrolled depth, or the authors' plain N(0, init_std) in
  paper.yaml), not the official truncated-normal sqrt(2 / 5d).
"""

from __future__ import annotations

import math

import torch

from stateloop.models.baselines.options import PonderLMOptions
from stateloop.models.kernels import upcast
from stateloop.models.looped import LoopedLM, ModelOutput


class PonderLM(LoopedLM):
    """K passes of the full backbone with pondering embeddings in between (see module docstring)."""

    def __init__(self, cfg, opts: PonderLMOptions | None = None):
        super().__init__(cfg)
        self.opts = opts or PonderLMOptions()

    @property
    def pondering_steps(self) -> int:
        return self.cfg.K - 1  # s

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.cfg.d_model) if self.opts.scale_embeds else 1.0  # c

    def pondering_embedding(self, logits: torch.Tensor) -> torch.Tensor:
        """c softmax(logits) E: the expected input embedding under the predicted distribution."""
        p = torch.softmax(upcast(logits), dim=-1).to(self.embed.weight.dtype)  # (B, T, V)
        return self.embed_scale * (p @ self.embed.weight)  # (B, T, d)

    def inputs(self, idx: torch.Tensor, cache):
        """z^0 = s c E[x] (or c E[x]) at the token positions."""
        s, c = self.pondering_steps, self.embed_scale
        z = c * self.embed(idx)  # c E[x]
        if self.opts.multiply_pondering_steps and s > 0:
            z = s * z  # z^0 = s c E[x]
        return z, self.rotary(idx.shape[1], cache, idx.device, z.dtype)

    def loop(self, z, rope, cache) -> ModelOutput:
        s = self.pondering_steps
        for j in range(s):
            z = self.pondering_pass(j, z, rope, cache)  # z^{j+1}
        return ModelOutput(hidden=self.apply_backbone(z, rope, cache, s))  # final pass; its head in forward

    def pondering_pass(self, j: int, z: torch.Tensor, rope, cache) -> torch.Tensor:
        """Pondering pass j: z^{j+1} = z^j + c softmax(W_o RMSNorm_f(T(z^j))) E."""
        H = self.apply_backbone(z, rope, cache, j)  # pass j, its own caches
        return self.ponder(z, H)

    def ponder(self, z: torch.Tensor, H: torch.Tensor) -> torch.Tensor:
        return z + self.pondering_embedding(self.lm_head(H))  # z^{j+1}

    checkpoint_units = {"iteration": (pondering_pass,), "layer": (ponder,)}
