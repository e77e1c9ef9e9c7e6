"""MeSH, Memory-as-State-Highways (Yu et al., ICLR 2026): a slot buffer with step-wise routers.

Structure "8 + 8R10 + 8" at 1.4B: prelude f_pre, a shared core f_core repeated K times (K = 10),
coda f_coda. Instead of one hidden state carried from step to step, every token owns a buffer of
S = K + 3 slots m_0..m_{S-1} (13 at K = 10), and the steps exchange information through it
with softmax routers that are unique to each step (no step embedding is needed: the routers
are what differ between steps). With h_emb = sqrt(d) E[x]:

    m_0 = h_emb,  m_1 = ... = m_{S-1} = 0
    transitional cycle (router pair 0):
        h_p = f_pre(h_emb)
        w^w = softmax(R^w_0 h_p + b^w_0),  w^r = softmax(R^r_0 h_p + b^r_0)     (over slots)
        m_b <- m_b + w^w_b h_p  (all b);   h^0 = sum_b w^r_b m_b
    core steps t = 0..K-1 (router pair t + 1; the routers read the core *input* h^t):
        w^w = softmax(R^w_{t+1} h^t + b^w_{t+1}),  w^r = softmax(R^r_{t+1} h^t + b^r_{t+1})
        h_m = f_core(h^t)
        m_b <- m_b + w^w_b h_m;   h^{t+1} = sum_b w^r_b m_b         (read after the write)
    logits = W_o RMSNorm_f(f_coda(h^K))

Routers: R in R^{S x d} with a bias in R^S, K + 1 write and K + 1 read routers; extra
parameters (K + 1) 2 (d + 1) S (1421.51M at 1.4B; the paper's count shows the biases). The
buffer is transient: it lives inside one token's forward pass, so decoding needs only the KV
caches of every layer application: prelude ("prelude"), core step t ("T", t), coda ("coda").

What the paper leaves open, and the choices made here:
- [spec] Writes go to every slot, slot 0 included: the update is "m_b += w_w[b] h_p for all b"
  (the MeSH update as specified for this reproduction, docs/baselines.md#mesh), so the raw
  embedding in slot 0 is the start of a slot like the others, not a protected copy. [option]
  ``protect_embedding_slot: true`` masks slot 0's write logit instead, so the raw embedding
  stays readable in slot 0 at every step (an "embedding highway"); the slot-0 row of every write
  router is then unused, and the parameter count is the same either way.
- [assume] The transitional cycle above (the paper's Algorithm 2 is a figure, not text).
- [assume] Routers read h directly (no normalisation); router weights N(0, init_std), bias 0
  (uniform weights 1/S at init up to the small weight noise).
- [paper, optional] h_emb is scaled by sqrt(d), as in MeSH's own recipe and the shared backbone.
- The backbone init is the shared one, residual outputs scaled by the unrolled depth
  n_prelude + K n_core + n_coda (96 at 1.4B), which is MeSH's recipe too.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from stateloop.models.baselines.common import PreludeCoreCodaLM
from stateloop.models.baselines.options import MeshOptions, check_mesh_depth, resolve_slots
from stateloop.models.kernels import upcast
from stateloop.models.looped import ModelOutput


class SlotRouter(nn.Module):
    """The write and read routers of one step: per-token softmax weights over the S slots."""

    def __init__(self, d: int, n_slots: int, protect_slot0: bool):
        super().__init__()
        self.write = nn.Linear(d, n_slots, bias=True)  # R^w, b^w
        self.read = nn.Linear(d, n_slots, bias=True)  # R^r, b^r
        self.protect_slot0 = protect_slot0

    def forward(self, h: torch.Tensor):
        """h (B, T, d) -> write and read weights (B, T, S), each summing to one over the slots."""
        logits_w = upcast(self.write(h))
        if self.protect_slot0:
            logits_w = logits_w.masked_fill(torch.arange(logits_w.shape[-1], device=h.device) == 0, float("-inf"))
        w_write = torch.softmax(logits_w, dim=-1).to(h.dtype)
        w_read = torch.softmax(upcast(self.read(h)), dim=-1).to(h.dtype)
        return w_write, w_read


def write_then_read(m: torch.Tensor, h_new: torch.Tensor, w_write: torch.Tensor, w_read: torch.Tensor):
    """One buffer step: m_b <- m_b + w^w_b h_new for every slot b, then read sum_b w^r_b m_b.

    m (B, T, S, d), h_new (B, T, d), weights (B, T, S) -> (new buffer, read-out (B, T, d))."""
    m = m + w_write[..., None] * h_new[..., None, :]
    return m, torch.einsum("bts,btsd->btd", w_read, m)


class MeshLM(PreludeCoreCodaLM):
    """Prelude -> K router-mediated core steps over a slot buffer -> coda (module docstring)."""

    def __init__(self, cfg, opts: MeshOptions | None = None):
        opts = opts or MeshOptions()
        super().__init__(cfg, opts, "mesh")  # self.backbone: the shared core f_core
        self.n_slots = resolve_slots(cfg, opts)
        self.routers = nn.ModuleList(
            SlotRouter(cfg.d_model, self.n_slots, opts.protect_embedding_slot) for _ in range(cfg.K + 1)
        )

    def config_at(self, K: int):
        """At another K the model keeps its trained buffer of S slots (its default S = K + 3 would follow K)."""
        return dataclasses.replace(super().config_at(K), options={**self.trained_cfg.options, "n_slots": self.n_slots})

    def init_buffer(self, h_emb: torch.Tensor) -> torch.Tensor:
        """m_0 = h_emb, the other slots 0: (B, T, S, d)."""
        m = h_emb.new_zeros(*h_emb.shape[:-1], self.n_slots, h_emb.shape[-1])
        m[..., 0, :] = h_emb
        return m

    def loop(self, h_emb, rope, cache, return_buffers: bool = False) -> ModelOutput:
        """With ``return_buffers``, ``output.states`` lists the buffer after every write
        (transitional cycle, then core steps 1..K), for the analyses and tests."""
        m = self.init_buffer(h_emb)
        buffers = []
        # Transitional cycle: the prelude output is written, then the core's first input is read.
        h_p = self.apply_stack(self.prelude, h_emb, rope, cache, ("prelude",))
        m, h = write_then_read(m, h_p, *self.routers[0](h_p))
        buffers.append(m)
        for t in range(self.cfg.K):
            m, h = self.core_step(t, m, h, rope, cache)
            buffers.append(m)
        out = self.apply_stack(self.coda, h, rope, cache, ("coda",))
        return ModelOutput(hidden=out, states=buffers if return_buffers else None)

    def core_step(self, t: int, m: torch.Tensor, h: torch.Tensor, rope, cache):
        """Core step t: (m, h^t) -> (m', h^{t+1})."""
        w_write, w_read = self.routers[t + 1](h)  # routers read the core input h^t
        h_m = self.apply_backbone(h, rope, cache, t)
        return write_then_read(m, h_m, w_write, w_read)

    checkpoint_units = {"iteration": (core_step,)}
    depth_check = staticmethod(check_mesh_depth)
    per_iteration = ("routers",)  # router pair t + 1 of core step t, after the transitional cycle's pair 0
