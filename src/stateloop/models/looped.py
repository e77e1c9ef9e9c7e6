"""Looped language models: one shared backbone T applied K times, with or without a state.

Notation: the paper's (Sec. 3). Iterations are counted from 0, H^k is the output of backbone
application k, Z^k its input, and E = sqrt(d) W_E[x] the scaled input embeddings. The state
after iteration k is S^{k+1} and the read taken from it R_{k+1}, so states and reads are
numbered 1..K, as in Figure 4 ("R1..R7", "S3", "S4" at K = 7). Equation numbers are the paper's
(1)-(15): (1) the start, (2), (5), (6) the update (retention g^k, write rate eta^k = 1 - g^k),
(3) update, mixer and the state read N^{k+1},
(4) the feedback read, (7)-(9) the mixers, (10) the terminal read, (11) the head, (12) the loss
(train/loop.py, evaluate/perplexity.py), (13) state only, (14) reset, (15) the calibration
(analysis/interventions.py). The paper writes a read as N^{k+1} W^T with N^{k+1} =
RMSNorm_s(S^{k+1}) a row per token; below it is W N^{k+1} per token, the same map.

Vanilla Looped (Universal-Transformer style):

    H^0 = T(E),  H^k = T(H^{k-1}),  k = 1..K-1        one weight set, K applications; (1) without S
    logits = W_o RMSNorm_f(H^{K-1})                   untied LM head, (11) with Y = H^{K-1}

StateLoop adds one persistent state S in R^{d_s} per token. With Z^0 = E and S^0 = 0 (eq. 1),
for k = 0..K-1:

    H^k      = T(Z^k)                                   backbone application k; H^0 = T(E) (1), (4)
    U^k      = RMSNorm_h(H^k)                           (2)
    S~^{k+1} = V_phi(S^k, U^k)                          update (3), (5), (6): models/state.py
    S^{k+1}  = X_psi(S~^{k+1})                          mixer (3), (7)-(9): models/mixers.py
    N^{k+1}  = RMSNorm_s(S^{k+1})                       the state read (3)
    R_{k+1}  = W_{s->z} N^{k+1},  Z^{k+1} = H^k + R_{k+1}             (k < K-1) feedback read (4)
    Y        = H^{K-1} + R_K,  R_K = W_{s->out} N^K                   terminal read (10)
    logits   = W_o RMSNorm_f(Y)                                       head (11); loss (12)

Extra parameters: W_u, W_Delta (d_s x d), b_Delta, A_log (d_s), W_{s->z}, W_{s->out} (d x d_s),
RMSNorm_h (d), RMSNorm_s (d_s): 4 d d_s + 3 d_s + d.

Ablations (Table 4):
- ``state_only`` (paper, eq. 13): "The state-only alternative uses a gated state itself as the
  next backbone input Z^{k+1}. From X^0 = 0 and H^0 = T(E), its recurrence for k = 0..K-2 is
  X^{k+1} = Cell(H^k, X^k), Z^{k+1} = X^{k+1}, H^{k+1} = T(Z^{k+1})". X^k is the gated state, of
  the backbone width, and Cell eq. (6) at d_s = d with H^k as input and X^k as previous state. So
  the gated state *replaces* the next backbone input (no residual from the previous iteration),
  there are K backbone applications and K-1 cell updates, and the prediction reads the last
  backbone output H^{K-1} through the final norm and head: no reads, no W_{s->z} / W_{s->out}.
  Parameters: W_u, W_Delta, b_Delta, A_log, RMSNorm_h (409.00M at 410M, the paper's count).
- ``reset_state`` (eq. 14, left): S^k is replaced by 0 before every update, so nothing persists
  across iterations: S^{k+1} = eta^k P^k, with eta^k = 1 - g^k the write rate of eq. (6).
- ``stateloop_gru``: a GRU cell replaces eq. (6); P^k, feedback and readout unchanged.

Hooks for the analyses (paper, Sec. 5), all keyword arguments of ``forward``:
- ``return_states=True``: ``output.states`` = [S^1, ..., S^K] (after the mixer);
- ``read_mask`` (K,) or (B, K): entry i-1 is read R_i's multiplier, 1 keeps it, 0 zeroes it;
- ``state_overrides`` {i: tensor}: S^i (i = 1..K) is replaced after its update (and mixer), at
  boundary i; the following iterations update from the replacement. Freezing S^i at every
  boundary after i is ``{j: frozen_j for j in range(i + 1, K + 1)}``. For ``state_only`` the
  keys and ``states`` are those of its gated state X^1..X^{K-1}.
- ``diagnostics`` (a dict): each forward adds, for every state S^i it makes (i = 1..K; X^1..X^{K-1}
  for ``state_only``), sums over its tokens to ``diagnostics[i]`` (evaluate/diagnostics.py
  summarises them): ``tokens``; ``write_rate``, the per-channel sum of eta^{i-1} = 1 - g^{i-1}, the
  fraction of each channel the proposal overwrites (eq. 6's update only; g^k is the retention);
  ``state_norm``, of ||S^i||; ``read_ratio``, of ||R_i|| / ||H^{i-1}||, the read against the
  backbone output it is added to (R_K is the terminal read; models with reads). Everything is
  recomputed beside the forward from the same tensors, so the forward's numbers are unchanged;
  without the hook nothing is computed.

Activation checkpointing is applied from outside (train/checkpointing.py wraps the layers, stacks
and the methods a class names in ``checkpoint_units``), and so are the fused inference forms
(stateloop/fast.py switches on the forms the modules declare).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from stateloop.config import ConfigError
from stateloop.models.backbone import Backbone, RMSNorm, Rotary
from stateloop.models.cache import ModelCache
from stateloop.models.kernels import cast, upcast
from stateloop.models.mixers import build_mixer
from stateloop.models.options import FFNOptions
from stateloop.models.state import build_cell


@dataclass
class ModelOutput:
    logits: torch.Tensor | None = None  # (B, T, V): next-token logits at every real token position
    states: list[torch.Tensor] | None = None  # S^1..S^K when requested
    hidden: torch.Tensor | None = None  # (B, T, d): Y, the LM head's input (eq. 11), at the same positions
    loss: torch.Tensor | None = None  # loss_fn(model, Y) when the forward was given one (then no logits)


class LoopedLM(nn.Module):
    """Vanilla Looped (module docstring) and the contract every registered model follows:
    :meth:`forward` is written once, here, with the decoding bookkeeping for every model.
    Subclasses override :meth:`loop` (the model itself: StateLoop's state, the baselines' unique
    stacks, streams and buffers) and, where their input sequence is not the scaled embedding at
    positions ``cache.seq_len ...``, :meth:`inputs` (PonderLM's z^0, Pause Token's pause-expanded
    sequence). A loop returns Y, the input of the final norm and head, at the real tokens only (Pause
    Token reads each group's last pause). Its looped stack runs through :meth:`apply_backbone` and
    its unique stacks through :meth:`apply_stack`.

    What the machinery outside models/ reads, declared by each class (docs/adding-a-model.md):
    ``checkpoint_units``, per activation-checkpointing level, the class's methods that are one unit
    beside every ``Layer`` ("layer") and ``Backbone`` ("iteration") application (train/checkpointing.py);
    ``per_iteration``, the attributes whose parameters belong to particular iterations, iteration
    axis first (test-time depth, tests/models/test_test_time_depth.py); ``depth_check``, the
    torch-free (trained config, K) -> None that refuses a test-time K in one line, the same function
    as its registry entry's ``depth`` (None: every K).
    """

    checkpoint_units: dict = {}
    per_iteration: tuple[str, ...] = ()
    depth_check = None

    def __init__(self, cfg, d_ff: int | None = None, n_layers: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.trained_cfg = cfg  # the config the parameters were built for; at_depth changes only cfg.K
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        # The looped stack (n_layers defaults to cfg.n_layers; prelude/core/coda baselines pass
        # the size of their shared core here).
        self.backbone = Backbone.from_config(cfg, n_layers=n_layers, d_ff=d_ff)
        self.norm_f = RMSNorm(d, cfg.norm_eps)
        self.head = nn.Linear(d, cfg.vocab_size, bias=False)

    # -- test-time depth -------------------------------------------------------------------------
    def at_depth(self, K: int) -> LoopedLM:
        """Run the same weights at K loop iterations from now on (in place; returns the model).

        Every loop reads ``cfg.K``, so the state, the reads and the decoding caches follow the new
        K exactly as the equations do (S^1..S^K, feedback reads R_1..R_{K-1}, terminal read R_K,
        caches ("T", 0..K-1)). A model whose parameters are tied to particular iterations
        refuses another K in one line: its class's ``depth_check``, the function its registry
        entry's ``depth`` names, with which a config's ``test_time_K`` is checked before any model is built.
        """
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise ConfigError(f"eval.K: the loop depth must be a positive integer, got {K!r}")
        if self.depth_check is not None:
            self.depth_check(self.trained_cfg, K)
        self.cfg = dataclasses.replace(self.cfg, K=K)
        return self

    def config_at(self, K: int):
        """The config that builds this model's equations at K loop iterations, for the shapes it was
        trained with: the trained config at K (MeSH keeps its trained buffer)."""
        return dataclasses.replace(self.trained_cfg, K=K)

    # -- pieces shared by every model ------------------------------------------------------------
    @property
    def n_layer_applications(self) -> int:
        """Layer applications per token (the unrolled depth), used to scale the init."""
        return self.cfg.K * self.cfg.n_layers

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        return self.embed(idx) * math.sqrt(self.cfg.d_model)  # (1): E = sqrt(d) Embed(x)

    def rotary(self, T: int, cache: ModelCache | None, device, dtype) -> Rotary:
        offset = 0 if cache is None else cache.seq_len
        return Rotary(T, offset, self.cfg.head_dim, self.cfg.rope_theta, device, dtype)

    def apply_backbone(self, h: torch.Tensor, rope: Rotary, cache: ModelCache | None, k: int) -> torch.Tensor:
        """Application k = 0..K-1 of T, with the KV caches of that application when decoding."""
        return self.apply_stack(self.backbone, h, rope, cache, ("T", k))

    def apply_stack(self, stack: Backbone, h: torch.Tensor, rope: Rotary, cache: ModelCache | None, key) -> torch.Tensor:
        """One application of a stack of decoder layers with its per-layer KV caches under ``key``."""
        return stack(h, rope, None if cache is None else cache.kv_list(key, len(stack.layers)))

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm_f(h))  # (11): LMHead(Y) = W_o RMSNorm_f(Y), softmax in the loss (12)

    # -- forward: the same for every model ------------------------------------------------------
    def forward(self, idx: torch.Tensor, cache: ModelCache | None = None, loss_fn=None, **hooks) -> ModelOutput:
        """idx (B, T) token ids -> next-token logits (B, T, V). With ``cache``, idx continues the
        sequence already in the cache (prefill, then one token or a chunk at a time). ``hooks``
        are the keyword arguments of the model's :meth:`loop` (the analyses' hooks).

        ``loss_fn(model, Y)``: instead of the logits, ``output.loss`` is computed from Y, the head's
        input (B, T, d), inside the forward (train/loss.py's chunked loss: under FSDP the head's
        parameters are gathered only inside it)."""
        h, rope = self.inputs(idx, cache)
        out = self.loop(h, rope, cache, **hooks)
        if loss_fn is None:
            out.logits = self.lm_head(out.hidden)  # (11)
        else:
            out.loss = loss_fn(self, out.hidden)
        if cache is not None:
            cache.advance(idx.shape[1])  # the cache counts real tokens
        return out

    # -- the extension points -------------------------------------------------------------------
    def inputs(self, idx: torch.Tensor, cache: ModelCache | None) -> tuple[torch.Tensor, Rotary]:
        """idx (B, T) -> the loop's input Z^0 = E = sqrt(d) W_E[x] and its RoPE positions, which
        continue the ``cache.seq_len`` tokens already decoded."""
        h = self.embed_tokens(idx)
        return h, self.rotary(idx.shape[1], cache, idx.device, h.dtype)

    def loop(self, h: torch.Tensor, rope: Rotary, cache: ModelCache | None) -> ModelOutput:
        """The model: its input h (B, T', d) -> Y (B, T, d) at the real tokens, the input of the head
        (``ModelOutput.hidden``). Application k of the looped stack runs through
        ``apply_backbone(h, rope, cache, k)``."""
        for k in range(self.cfg.K):
            h = self.apply_backbone(h, rope, cache, k)  # H^k = T(H^{k-1}), H^{-1} = E
        return ModelOutput(hidden=h)  # Y = H^{K-1}; logits W_o RMSNorm_f(Y) in forward


class WideFFNLoopedLM(LoopedLM):
    """Vanilla Looped + FFN: Vanilla Looped with a wider SwiGLU, f = ``opts.d_ff`` or, by default, the
    width that matches StateLoop + Mamba-2's parameters at d_s = d (:func:`matched_ffn_width`)."""

    def __init__(self, cfg, opts: FFNOptions):
        super().__init__(cfg, d_ff=opts.d_ff if opts.d_ff is not None else matched_ffn_width(cfg))


class StateLoopLM(LoopedLM):
    """StateLoop and its ablations: eqs. (1)-(11), (14) (the loss (12) is train/loop.py's). See the
    module docstring. The state width d_s is checked once, by the registry (models/registry.py:
    positive; state only: d_s = d)."""

    def __init__(self, cfg, update: str = "ssm", mixer: str = "identity", reset: bool = False, reads: bool = True):
        super().__init__(cfg)
        d, d_s = cfg.d_model, cfg.d_s
        self.reset, self.has_reads = reset, reads
        self.cell = build_cell(update, cfg)  # V_phi of (3): (2), (5), (6) or the GRU
        self.mixer = build_mixer(mixer, cfg)  # X_psi of (3): (7)-(9)
        if reads:
            self.norm_s = RMSNorm(d_s, cfg.norm_eps)
            self.W_sz = nn.Linear(d_s, d, bias=False)  # W_{s->z}: feedback reads R_1..R_{K-1}
            self.W_sout = nn.Linear(d_s, d, bias=False)  # W_{s->out}: terminal read R_K
            # model.read_init (config.py): "residual" scales both like residual-output projections.
            self.W_sz.residual_out = self.W_sout.residual_out = cfg.read_init == "residual"

    def read(self, W: nn.Linear, S: torch.Tensor, keep=None) -> torch.Tensor:
        """A read of the state, R = N W^T with W = W_{s->z} (feedback, eq. 4) or W_{s->out} (terminal,
        eq. 10), times ``keep``, the read mask's multiplier (analyses; None keeps the read)."""
        N = self.norm_s(S)                 # (3)  N^{k+1} = RMSNorm_s(S^{k+1}); S is float32 (models/state.py)
        R = W(cast(N, W.weight.dtype))     # (4), (10)  R_{k+1} = N^{k+1} W^T, in W's dtype
        return R if keep is None else R * keep

    def step(self, k: int, Z: torch.Tensor, S: torch.Tensor | None, rope: Rotary, cache: ModelCache | None):
        """Iteration k = 0..K-1 without its read: H^k = T(Z^k), S^{k+1} = Mixer(Update(S^k, H^k)),
        S^0 = None (zero). Returns (H^k, S^{k+1}). The loop below and the analyses (prefix-shared
        Shapley masks) share it."""
        H = self.apply_backbone(Z, rope, cache, k)  # H^k = T(Z^k)
        return H, self.update(k, S, H, rope, cache)

    def update(self, k: int, S: torch.Tensor | None, H: torch.Tensor, rope: Rotary, cache: ModelCache | None):
        """The state branch of iteration k: S^{k+1} = Mixer(Update(S^k, H^k)) (eq. 3)."""
        S = self.cell(None if self.reset else S, H)  # (2), (5), (6): S~^{k+1} of (3); (14) resets S^k to 0
        mix_cache = None if cache is None else cache.get(("mixer", k), self.mixer.new_cache)
        return self.mixer(S, rope, mix_cache)  # (3) S^{k+1} = X(S~^{k+1}): (8), (9)

    def feedback(self, H: torch.Tensor, S: torch.Tensor, keep=None) -> torch.Tensor:
        """The feedback read, eq. (4): the next backbone input from H^k and the state S^{k+1}."""
        return H + self.read(self.W_sz, S, keep)  # (4)  Z^{k+1} = H^k + N^{k+1} W_{s->z}^T = H^k + R_{k+1}

    def terminal(self, H: torch.Tensor, S: torch.Tensor, keep=None) -> torch.Tensor:
        """The terminal read, eq. (10): the input of the final norm and head from H^{K-1} and S^K."""
        return H + self.read(self.W_sout, S, keep)  # (10)  Y = H^{K-1} + N^K W_{s->out}^T = H^{K-1} + R_K

    def loop(self, h, rope, cache, return_states: bool = False, read_mask=None, state_overrides=None,
             diagnostics: dict | None = None) -> ModelOutput:
        K = self.cfg.K
        keeps = self._read_keeps(read_mask, h)  # keeps[i-1] multiplies R_i (None: kept)
        states = []
        Z, S = h, None  # (1): Z^0 = E, S^0 = 0
        for k in range(K):
            H, S = self.step(k, Z, S, rope, cache)  # H^k, S^{k+1}
            if state_overrides and k + 1 in state_overrides:
                S = state_overrides[k + 1].to(S.dtype).expand_as(S)
            if return_states:
                states.append(S)
            if diagnostics is not None:
                self.diagnose(diagnostics, k, H, S, (self.W_sz if k < K - 1 else self.W_sout, keeps[k]))
            if k < K - 1:
                Z = self.feedback(H, S, keeps[k])  # (4): Z^{k+1} = H^k + R_{k+1}
        return ModelOutput(hidden=self.terminal(H, S, keeps[K - 1]), states=states if return_states else None)  # (10)

    @torch.no_grad()
    def diagnose(self, out: dict, k: int, H: torch.Tensor, S: torch.Tensor, read=None) -> None:
        """The ``diagnostics`` hook (module docstring) for iteration k: its output H^k, the state
        S^{k+1} it made and ``read`` = (the read's projection, its mask multiplier) when it has one."""
        sums = out.setdefault(k + 1, {})

        def add(name, value):
            value = value.detach().double()
            sums[name] = sums[name] + value if name in sums else value

        add("tokens", torch.tensor(float(H.shape[0] * H.shape[1])))
        add("state_norm", upcast(S).norm(dim=-1).sum())  # in the wide dtype (models/kernels.py)
        if hasattr(self.cell, "write_rate"):  # eq. (6)'s cell (the GRU's update has no single retention)
            add("write_rate", upcast(self.cell.write_rate(H)).flatten(0, -2).sum(0))
        if read is not None and self.has_reads:
            R = self.read(read[0], S, read[1])
            add("read_ratio", (upcast(R).norm(dim=-1) / upcast(H).norm(dim=-1).clamp_min(1e-30)).sum())

    # [choice] The state branch is a unit of its own under "layer" (benchmarks/records/2026-12-05-activation-memory.md).
    checkpoint_units = {"iteration": (step,), "layer": (update,)}

    def _read_keeps(self, read_mask, h):
        K = self.cfg.K
        if read_mask is None:
            return [None] * K
        if not self.has_reads:
            raise ValueError(f"{self.cfg.name} has no state reads to mask")
        m = torch.as_tensor(read_mask, dtype=h.dtype, device=h.device)
        if m.shape[-1] != K or m.dim() > 2:
            raise ValueError(f"read_mask must have shape (K,) or (B, K) with K={K}; got {tuple(m.shape)}")
        if m.dim() == 1:
            return [m[k] for k in range(K)]
        return [m[:, k, None, None] for k in range(K)]


class StateOnlyLM(StateLoopLM):
    """Table 4's state-only feedback, eq. (13) (module docstring): X^{k+1} = Cell(H^k, X^k) and
    Z^{k+1} = X^{k+1}, the gated state alone is the next backbone input; the head reads the last
    backbone output H^{K-1}."""

    def __init__(self, cfg):
        super().__init__(cfg, reads=False)  # d_s = d: checked by the registry (models/registry.py)

    def loop(self, h, rope, cache, return_states: bool = False, read_mask=None, state_overrides=None,
             diagnostics: dict | None = None) -> ModelOutput:
        K = self.cfg.K
        self._read_keeps(read_mask, h)  # refuses a mask: there are no reads
        states = []
        Z, X = h, None  # Z^0 = E, X^0 = 0
        for k in range(K - 1):
            H, X = self.step(k, Z, X, rope, cache)  # H^k = T(Z^k), X^{k+1} = Cell(H^k, X^k)
            if state_overrides and k + 1 in state_overrides:
                X = state_overrides[k + 1].to(X.dtype).expand_as(X)
            if return_states:
                states.append(X)
            if diagnostics is not None:
                self.diagnose(diagnostics, k, H, X)
            Z = X.to(h.dtype)  # Z^{k+1} = X^{k+1}; the backbone runs in the activations' dtype, the state stays float32
        H = self.apply_backbone(Z, rope, cache, K - 1)  # H^{K-1} = T(Z^{K-1})
        return ModelOutput(hidden=H, states=states if return_states else None)  # the head reads H^{K-1}


def matched_ffn_width(cfg) -> int:
    """The SwiGLU width that gives Vanilla Looped + FFN the parameters of StateLoop + Mamba-2
    (at d_s = d): the paper's control, 5818 at 1.4B. Counted on the meta device."""
    with torch.device("meta"):
        mamba = StateLoopLM(dataclasses.replace(cfg, name="stateloop_mamba2", d_s=cfg.d_model, options={}), mixer="mamba2")
        vanilla = LoopedLM(dataclasses.replace(cfg, name="vanilla_looped", d_s=0, options={}))
    extra = sum(p.numel() for p in mamba.parameters()) - sum(p.numel() for p in vanilla.parameters())
    return cfg.d_ff + round(extra / (3 * cfg.d_model * cfg.n_layers))
