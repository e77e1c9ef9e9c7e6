"""Parcae (Prairie et al. 2026): a prelude / recurrent core / coda model with a stable injection.

Structure (8 + 8 x 10 + 8 at 1.4B; K = core repetitions):

    e    = RMSNorm_pre(P(sqrt(d) E[x]))           prelude P, then the extra prelude norm
    h_0  ~ random (see below) or 0
    for r = 1..K:
        Delta = softplus(dt_bias),  a = exp(-Delta * exp(A_log))  in (0, 1)^d
        u     = a * h_{r-1} + Delta * (B e)        diagonal injection
        h_r   = R(u)                               the shared core, 8 pre-norm layers with residuals
    logits = W_o RMSNorm_f(Cd(C h_K))              output projection C, then the coda Cd

So h_r = A h_{r-1} + B' e + f(A h_{r-1} + B' e) with A = diag(a) and B' = diag(Delta) B: A is a
negative diagonal continuous-time matrix -exp(A_log) discretised with a zero-order hold of step
Delta, and its spectral norm ||A||_2 = max a < 1 for *any* parameter values (see
:meth:`StableInjection.decay`, which keeps that true in floating point too).

New parameters, all shared across repetitions: B, C (d x d, no bias), A_log, dt_bias (d) and the
prelude RMSNorm (d): 2 d^2 + 3 d (1429.32M at 1.4B).

Initial state h_0 (``state_init``):
- ``random`` (default, the official ``like-init``): a truncated normal (+-3 sigma) with the
  embedding's init std, times the embedding scale: sigma = init_std, times sqrt(d) here.
  In training mode it is drawn fresh on every call (per sequence, token and channel), as the
  official code does. In eval mode it is a fixed function of the token position (drawn from a
  generator seeded by ``eval_seed`` and the position, the same for every sequence of a batch),
  so evaluation is reproducible and cached decoding equals the full forward. [choice: the
  official code resamples at every decode step as well.]
- ``zero``: h_0 = 0.

Init [code]: A_log = 0 (A = 1); dt_bias = softplus^-1(-ln sqrt(1/5)) = 0.2119, so Delta = 0.805
and a = sqrt(1/5) = 0.447; B = identity; C ~ truncated normal (+-3 sigma) with std sqrt(2/(5d)).
The parameters A_log, dt_bias, B, C are flagged ``_no_weight_decay`` (the official recipe).

Decoding: one KV cache per layer application: prelude ("prelude"), core repetition r ("T", r),
coda ("coda"); n_prelude + K n_core + n_coda per token.

What the paper leaves open, and the choices made here:
- [assume] A fixed number of repetitions K with full backprop through all of them (the official
  training samples the depth per sequence and backpropagates through the last <= 4 only).
- [assume] The backbone is the shared StateLoop one (untied, SwiGLU, sqrt(d) input scale, init
  scaled by the unrolled depth); the official 1.3B model's tied embeddings, ReLU^2, QK-norm and
  value embeddings are left out (the parameter count rules out tying and value embeddings).
- [assume] Random h_0 (configurable), deterministic per position in eval mode (above).
- The layer split defaults to thirds of n_layers (8/8/8 at 24 layers).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.backbone import RMSNorm
from stateloop.models.baselines.common import PreludeCoreCodaLM
from stateloop.models.baselines.options import ParcaeOptions
from stateloop.models.kernels import upcast
from stateloop.models.looped import ModelOutput

DECAY_INIT = math.sqrt(1.0 / 5.0)  # a at init [code: ssm_decay]
RATE_MIN, RATE_MAX = 1e-6, 80.0  # Delta exp(A_log) is clamped here, so a stays in (0, 1) in float32


def log_softplus(x: torch.Tensor) -> torch.Tensor:
    """log(softplus(x)), finite for every finite x (softplus(x) ~ e^x below -20)."""
    return torch.where(x < -20.0, x, torch.log(F.softplus(x.clamp(min=-20.0))))


class StableInjection(nn.Module):
    """u = a * h + Delta * (B e), a = exp(-Delta exp(A_log)); plus the output projection C."""

    def __init__(self, d: int):
        super().__init__()
        self.A_log = nn.Parameter(torch.empty(d))
        self.dt_bias = nn.Parameter(torch.empty(d))
        self.B = nn.Linear(d, d, bias=False)
        self.C = nn.Linear(d, d, bias=False)
        for p in (self.A_log, self.dt_bias, self.B.weight, self.C.weight):
            p._no_weight_decay = True

    def reset_parameters(self, std: float) -> None:
        """A_log = 0, dt_bias = softplus^-1(-ln sqrt(1/5)), B = I, C ~ TN(0, sqrt(2/(5d)), +-3 sigma)."""
        d = self.A_log.numel()
        with torch.no_grad():
            self.A_log.zero_()
            delta = -math.log(DECAY_INIT)
            self.dt_bias.fill_(math.log(math.expm1(delta)))
            self.B.weight.copy_(torch.eye(d))
            c_std = math.sqrt(2.0 / (5.0 * d))
            nn.init.trunc_normal_(self.C.weight, std=c_std, a=-3 * c_std, b=3 * c_std)

    def decay(self) -> torch.Tensor:
        """a = exp(-Delta exp(A_log)) in float32 (float64 in a float64 run), strictly inside (0, 1) for any finite parameters.

        Computed as exp(-exp(log softplus(dt_bias) + A_log)) with the rate clamped to
        [1e-6, 80]: a in [exp(-80), exp(-1e-6)], so no overflow (exp(A_log) = inf) or
        underflow (softplus = 0) can reach 0 or 1. The clamp is inactive at realistic values.
        """
        log_rate = log_softplus(upcast(self.dt_bias)) + upcast(self.A_log)
        rate = torch.exp(log_rate.clamp(math.log(RATE_MIN), math.log(RATE_MAX)))
        return torch.exp(-rate)

    def drive(self, e: torch.Tensor) -> torch.Tensor:
        """Delta B e in float32 at least: the same at every repetition, so computed once per forward."""
        return F.softplus(upcast(self.dt_bias)) * upcast(self.B(e))

    def forward(self, h: torch.Tensor, drive: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """a h + Delta B e, with ``drive`` = :meth:`drive` (e) and ``a`` = :meth:`decay` ()."""
        u = a * upcast(h) + drive
        return u.to(h.dtype)


class ParcaeLM(PreludeCoreCodaLM):
    """Prelude -> (stable injection -> core) x K -> C -> coda (see module docstring)."""

    def __init__(self, cfg, opts: ParcaeOptions | None = None):
        opts = opts or ParcaeOptions()
        super().__init__(cfg, opts, "parcae")  # self.backbone: the shared core R
        self.norm_pre = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.injection = StableInjection(cfg.d_model)
        self._h0_blocks: dict = {}  # eval-mode h_0, cached per (block, device, dtype)

    # -- initial state ---------------------------------------------------------------------------
    @property
    def state_std(self) -> float:
        return self.cfg.init_std  # the embedding's init std (the sqrt(d) scale is applied after)

    def initial_state(self, like: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """h_0 of shape like (B, T, d) for the given token positions (T,)."""
        if self.opts.state_init == "zero":
            return torch.zeros_like(like)
        s, scale = self.state_std, math.sqrt(self.cfg.d_model)
        if self.training:
            h0 = torch.empty(like.shape, device=like.device, dtype=torch.float32)
            nn.init.trunc_normal_(h0, std=s, a=-3 * s, b=3 * s)
            return (h0 * scale).to(like.dtype)
        h0 = self._fixed_state(positions, like.shape[-1], like.device, like.dtype)
        return h0.expand(like.shape)

    _BLOCK = 256  # positions per seeded block of the eval-mode h_0

    def _fixed_state(self, positions: torch.Tensor, d: int, device, dtype) -> torch.Tensor:
        """The eval-mode h_0: row p is drawn from a generator seeded by (eval_seed, p // 256), so it
        depends only on the position p, never on the batch or on how the sequence is chunked."""
        lo, hi = int(positions[0]), int(positions[-1]) + 1
        s, scale = self.state_std, math.sqrt(self.cfg.d_model)
        blocks = []
        for b in range(lo // self._BLOCK, (hi - 1) // self._BLOCK + 1):
            key = (b, str(device), dtype)
            if key not in self._h0_blocks:
                g = torch.Generator().manual_seed(self.opts.eval_seed * 1_000_003 + b)
                block = torch.empty(self._BLOCK, d)
                nn.init.trunc_normal_(block, std=s, a=-3 * s, b=3 * s, generator=g)
                self._h0_blocks[key] = (block * scale).to(device=device, dtype=dtype)
            blocks.append(self._h0_blocks[key])
        table = torch.cat(blocks)  # rows for positions (lo // 256) * 256 ...
        start = lo - (lo // self._BLOCK) * self._BLOCK
        return table[start : start + hi - lo]  # (T, d)

    # -- loop ------------------------------------------------------------------------------------
    def loop(self, x, rope, cache) -> ModelOutput:
        e = self.norm_pre(self.apply_stack(self.prelude, x, rope, cache, ("prelude",)))
        drive, a = self.injection.drive(e), self.injection.decay()  # the same at every repetition
        h = self.initial_state(e, rope.positions)  # drawn here, outside every checkpoint unit
        for r in range(self.cfg.K):
            h = self.repetition(r, h, drive, a, rope, cache)
        out = self.apply_stack(self.coda, self.injection.C(h), rope, cache, ("coda",))
        return ModelOutput(hidden=out)

    def repetition(self, r: int, h: torch.Tensor, drive: torch.Tensor, a: torch.Tensor, rope, cache) -> torch.Tensor:
        """h_r = R(a h_{r-1} + Delta B e)."""
        return self.apply_backbone(self.injection(h, drive, a), rope, cache, r)

    checkpoint_units = {"iteration": (repetition,)}
