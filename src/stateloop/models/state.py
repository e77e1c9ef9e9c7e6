"""State update cells V_phi: how the persistent state S absorbs the output H^k of iteration k.

Every cell is the update of eq. (3), S~^{k+1} = V_phi(S^k, U^k), k = 0..K-1 (iterations counted
from 0, S^0 = 0 by eq. (1)), with S in R^{B x T x d_s} (one state per token) and H in
R^{B x T x d}; the mixer of eq. (3) (models/mixers.py) then makes S^{k+1} from S~^{k+1}. The
paper's notation and equation numbers (Sec. 3; models/looped.py maps all of (1)-(15) to the code):

    U^k      = RMSNorm_h(H^k)                                                        (2)
    P^k      = U^k W_u^T                    proposal, d_s wide                       (5)
    Delta^k  = softplus(U^k W_Delta^T + b_Delta),  lambda = exp(A_log)              (6)
    g^k      = exp(-lambda * Delta^k)       retention gate
    eta^k    = 1 - g^k                      write gate (the write rate)
    S~^{k+1} = g^k * S^k + eta^k * P^k                                               (6)

Eq. (6) is a gated, input-selective diagonal SSM along the *iteration* axis: each channel c
keeps a fraction g^k_c of its old value and writes the rest, eta^k_c, from the proposal. With
S^k = 0 it is eq. (14)'s reset state, S^{k+1} = eta^k * P^k (and S~^1 of every model). At
initialisation (W_Delta = 0, softplus(b_Delta) = 0.3) the write rate of channel c is
eta_c = 1 - exp(-0.3 lambda_c), so the log-spaced lambda in [0.01, 4] spans slow and fast channels.

:meth:`SelectiveStateCell.forward` is eqs. (2), (5), (6) one line each (its fused inference form:
models/fused.py). The GRU ablation (Table 4) replaces eq. (6) by a GRU cell on the same P^k.

Precision [choice; the paper is silent]: the state S^k is kept in float32 (float64 in a float64
run: :func:`~stateloop.models.kernels.wide_dtype` of the activations), also under bf16 autocast
and in a model cast to bf16 for inference, and eq. (6) is evaluated in that dtype. S is a
recurrence over the K iterations whose slow channels move by tiny steps: at init the slowest
channel writes 1 - exp(-0.3 * 0.01) = 0.003 of its value per iteration, less than bf16's spacing
just below 1 (2^-8 = 0.0039), so in bf16 the retention g^k would round to 1 or to 0.996 and
S^k - P^k would cancel to bf16 noise (tests/models/test_precision.py measures both). This is
the same contract as Mamba's SSM state. Matmuls that read the state (reads, mixers) run in the
dtype of their weights or autocast's, as every other matmul does.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.backbone import RMSNorm
from stateloop.models.fused import selective_state_twin, takes_twin
from stateloop.models.kernels import cast, upcast

# Paper initialisation of eq. (6).
DELTA_INIT = 0.3  # softplus(b_Delta) at init
LAMBDA_RANGE = (0.01, 4.0)  # lambda = exp(A_log), log-spaced over the d_s channels


def inverse_softplus(y: float) -> float:
    """x with softplus(x) = y, i.e. log(e^y - 1)."""
    return math.log(math.expm1(y))


class SelectiveStateCell(nn.Module):
    """Eqs. (2), (5), (6). Parameters: RMSNorm_h (d), W_u, W_Delta (d_s x d), b_Delta, A_log (d_s)."""

    def __init__(self, d: int, d_s: int, eps: float = 1e-5):
        super().__init__()
        self.norm_h = RMSNorm(d, eps)
        self.W_u = nn.Linear(d, d_s, bias=False)
        self.W_delta = nn.Linear(d, d_s, bias=False)
        self.b_delta = nn.Parameter(torch.empty(d_s))
        self.A_log = nn.Parameter(torch.empty(d_s))

    def reset_parameters(self, std: float) -> None:
        """Paper init: W_Delta = 0, b_Delta = log(e^0.3 - 1), lambda log-spaced in [0.01, 4]."""
        nn.init.normal_(self.W_u.weight, std=std)
        nn.init.zeros_(self.W_delta.weight)
        nn.init.constant_(self.b_delta, inverse_softplus(DELTA_INIT))
        lo, hi = LAMBDA_RANGE
        with torch.no_grad():
            lam = torch.logspace(math.log10(lo), math.log10(hi), self.A_log.numel(), dtype=torch.float64)
            self.A_log.copy_(lam.log())

    def gates(self, H: torch.Tensor):
        """Proposal P^k (eq. 5) and retention g^k (eq. 6) for the output H^k of iteration k, in the
        state's wide dtype (module docstring)."""
        U = self.norm_h(H)                                          # (2)  U^k = RMSNorm_h(H^k)
        P = upcast(self.W_u(U))                                     # (5)  P^k = U^k W_u^T
        Delta = F.softplus(upcast(self.W_delta(U)) + self.b_delta)  # (6)  Delta^k = softplus(U^k W_Delta^T + b_Delta)
        lam = torch.exp(upcast(self.A_log))                         # (6)  lambda = exp(A_log)
        g = torch.exp(-lam * Delta)                                 # (6)  g^k = exp(-lambda * Delta^k)
        return P, g

    fused = False  # its fused inference form, models/fused.selective_state_twin, switched on by stateloop/fast.py

    def forward(self, S: torch.Tensor | None, H: torch.Tensor) -> torch.Tensor:
        """(S^k, H^k) -> S~^{k+1} of eq. (3), S = None being S^k = 0."""
        if takes_twin(self):
            return selective_state_twin(self, S, H)
        P, g = self.gates(H)
        if S is None:                              # S^k = 0: S^0, or the reset of (14)
            return (1 - g) * P                     # (6)  S~^{k+1} = (1 - g^k) P^k
        return g * cast(S, P.dtype) + (1 - g) * P  # (6)  S~^{k+1} = g^k S^k + (1 - g^k) P^k

    def write_rate(self, H: torch.Tensor) -> torch.Tensor:
        """eta^k = 1 - g^k (eq. 6): the fraction of each channel overwritten by the proposal."""
        return 1 - self.gates(H)[1]


class GRUStateCell(nn.Module):
    """GRU update (Table 4): S~^{k+1} = GRU(P^k, S^k) with P^k = U^k W_u^T, U^k = RMSNorm_h(H^k)
    (eqs. 5, 2).

    torch.nn.GRUCell(d_s, d_s) with gates r, z and candidate n:
        r = sigma(W_ir P + b_ir + W_hr S + b_hr),  z = sigma(W_iz P + b_iz + W_hz S + b_hz)
        n = tanh(W_in P + b_in + r * (W_hn S + b_hn)),  S~^{k+1} = (1 - z) * n + z * S^k
    Parameters: RMSNorm_h (d), W_u (d_s x d), 6 d_s^2 weights and 6 d_s biases.
    """

    def __init__(self, d: int, d_s: int, eps: float = 1e-5):
        super().__init__()
        self.norm_h = RMSNorm(d, eps)
        self.W_u = nn.Linear(d, d_s, bias=False)
        self.gru = nn.GRUCell(d_s, d_s)

    def reset_parameters(self, std: float) -> None:
        nn.init.normal_(self.W_u.weight, std=std)
        self.gru.reset_parameters()  # PyTorch default: U(-1/sqrt(d_s), 1/sqrt(d_s))

    def forward(self, S: torch.Tensor | None, H: torch.Tensor) -> torch.Tensor:
        """(S^k, H^k) -> S~^{k+1}. The GRU's arithmetic runs in its weights' dtype (or autocast's,
        as torch's GRU cell does); the state it returns is kept in the wide dtype like eq. (6)'s."""
        P = self.W_u(self.norm_h(H))  # (2), (5)
        shape = P.shape
        h = None if S is None else S.reshape(-1, shape[-1]).to(P.dtype)
        return upcast(self.gru(P.reshape(-1, shape[-1]), h).view(shape))


CELLS = {"ssm": SelectiveStateCell, "gru": GRUStateCell}


def build_cell(kind: str, cfg) -> nn.Module:
    """The state update V_phi of eq. (3) named ``kind``, for the model shape ``cfg`` (d, d_s;
    d_s is checked by the registry, models/registry.py)."""
    if kind not in CELLS:
        raise ValueError(f"{cfg.name}: unknown state update {kind!r} (known: {', '.join(CELLS)})")
    return CELLS[kind](cfg.d_model, cfg.d_s, cfg.norm_eps)
