"""Pause tokens (Goyal et al., ICLR 2024), in the StateLoop paper's compute-matched variant.

A plain (non-looped) backbone T reads every real token followed by P pause tokens
(P = K - 1 = 3 at K = 4), so each real token gets K positions x L layers = K L layer
applications, the compute of a K-times looped model:

    input   x_1 p p p x_2 p p p ... x_T p p p                      length (P + 1) T
    H       = T(sqrt(d) E[input])                                   one pass, RoPE positions 0..(P+1)T-1
    logits_t = W_o RMSNorm_f(H at the last pause after x_t)         prediction of x_{t+1}

The model is never trained to predict a pause: only the output at the last pause of each group
carries a label (x_{t+1}); the outputs at x_t and at the other pauses are ignored (label -100).
``forward`` returns exactly those T read-outs, so training is plain next-token CE on (B, T, V),
with one target per real token, like every other model. :func:`expand_with_pauses` builds the
expanded ids and the equivalent masked labels explicitly.

The pause embedding is one row of the input embedding E, an id the tokenizer never emits
(GPT-NeoX-20B has 50,277 ids, padded to 50,432), so there are no new parameters (1420.92M).

Decoding: a prompt is expanded the same way; each new real token is appended as the chunk
[x, p, ..., p] of P + 1 positions to the ordinary per-layer KV caches (L caches growing by P + 1
entries per real token). ``ModelCache.seq_len`` counts real tokens; the RoPE offset of the next
chunk is (P + 1) seq_len.

What the paper leaves open, and the choices made here:
- [assume] Non-looped 24-layer T, with K - 1 pauses per token (the ``n_pause`` option overrides).
- [assume] The pause id is the last padded row, ``vocab_size - 1`` (option ``pause_id``). Real
  tokens must not use that id; nothing checks it.
- [assume] Consecutive RoPE positions over the expanded sequence; a training sequence of T real
  tokens is a (P + 1) T-position context.
- Init: residual outputs scaled by the depth of the residual stream, L layers (not K L: every
  position passes through T once), see ``n_layer_applications``.
"""

from __future__ import annotations

import torch

from stateloop.models.backbone import Rotary
from stateloop.models.baselines.options import PauseTokenOptions, check_pause_token_depth, resolve_pause
from stateloop.models.looped import LoopedLM, ModelOutput

IGNORE_INDEX = -100


def expand_with_pauses(idx: torch.Tensor, n_pause: int, pause_id: int, targets: torch.Tensor | None = None):
    """Insert ``n_pause`` pause ids after every token and build the matching labels.

    idx (B, T) -> ids (B, (P+1) T): x_1 p..p x_2 p..p ... x_T p..p.
    labels (B, (P+1) T): -100 everywhere except at the last pause after x_t, which holds the
    target of x_t: ``targets[:, t]`` when given, else the next real token x_{t+1} (and -100 for
    the last group, which has no next token). With P = 0 the last "pause" is x_t itself.
    """
    B, T = idx.shape
    G = n_pause + 1
    ids = pause_ids(idx, n_pause, pause_id)
    if targets is None:
        targets = torch.full_like(idx, IGNORE_INDEX)
        targets[:, :-1] = idx[:, 1:]
    labels = torch.full((B, T, G), IGNORE_INDEX, dtype=torch.long, device=idx.device)
    labels[:, :, -1] = targets
    return ids, labels.reshape(B, T * G)


def pause_ids(idx: torch.Tensor, n_pause: int, pause_id: int) -> torch.Tensor:
    """idx (B, T) -> (B, (P+1) T): each token followed by ``n_pause`` pause ids."""
    B, T = idx.shape
    ids = torch.full((B, T, n_pause + 1), pause_id, dtype=idx.dtype, device=idx.device)
    ids[:, :, 0] = idx
    return ids.reshape(B, T * (n_pause + 1))


class PauseTokenLM(LoopedLM):
    """One pass of T over the pause-expanded sequence; logits read at each group's last pause."""

    def __init__(self, cfg, opts: PauseTokenOptions | None = None):
        super().__init__(cfg)
        self.opts = opts or PauseTokenOptions()
        self.pause_id = resolve_pause(cfg, self.opts)[1]

    @property
    def n_pause(self) -> int:
        """Pauses after every real token: K - 1 of the current K (at_depth changes it), or the option."""
        return resolve_pause(self.cfg, self.opts)[0]

    @property
    def n_layer_applications(self) -> int:
        return self.cfg.n_layers  # depth of every position's residual stream

    @property
    def group(self) -> int:
        return self.n_pause + 1  # positions per real token

    def inputs(self, idx: torch.Tensor, cache):
        """sqrt(d) E[x_1 p..p x_2 p..p ...] (B, (P+1) T, d) at RoPE positions from (P+1) seq_len on
        (``seq_len`` counts real tokens)."""
        ids = pause_ids(idx, self.n_pause, self.pause_id)
        h = self.embed_tokens(ids)
        offset = 0 if cache is None else cache.seq_len * self.group
        return h, Rotary(ids.shape[1], offset, self.cfg.head_dim, self.cfg.rope_theta, idx.device, h.dtype)

    def loop(self, h, rope, cache) -> ModelOutput:
        """One pass of T over the expanded sequence; Y at the last pause of each group."""
        H = self.apply_backbone(h, rope, cache, 0)  # (B, (P+1) T, d)
        return ModelOutput(hidden=H[:, self.group - 1 :: self.group])  # the head reads the last pauses

    def expanded_logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits at every expanded position (B, (P+1) T, V), for analyses and tests."""
        h, rope = self.inputs(idx, None)
        return self.lm_head(self.apply_backbone(h, rope, None, 0))

    depth_check = staticmethod(check_pause_token_depth)
