"""Hyperloop Transformer (Zeitoun, Torroba-Hennigen, Kim 2026): a looped middle block with
loop-level hyper-connections over n parallel residual streams.

Begin block (unique layers) -> middle block looped L = K times -> end block (unique layers).
Hyper-connections act once per loop, not per layer. Per token, with streams Y in R^{n x d}:

    x_b  = Begin(sqrt(d) E[x]);   Y^0 = [x_b; ...; x_b]                  (n copies)
    for loop l = 0..L-1 (loop-specific W^{pre,post,res}_l in R^{n x nd}, b_l in R^n,
                         scalars alpha_l, loop embedding e_l in R^d):
        z      = RMSNorm(flatten(Y^l))                 over all n d entries, no learnable gain
        h_pre  = sigmoid(alpha^pre_l  W^pre_l  z + b^pre_l)       read weights
        h_post = 2 sigmoid(alpha^post_l W^post_l z + b^post_l)    write weights
        h_res  = sigmoid(alpha^res_l  W^res_l  z + b^res_l)       diagonal residual weights
        u      = sum_j h_pre[j] Y^l[j]
        o      = Mid(u) + e_l                          Mid: the shared middle layers, with their residuals
        Y^{l+1}[j] = h_res[j] Y^l[j] + h_post[j] o
    x_e = mean_j Y^L[j];   logits = W_o RMSNorm_f(End(x_e))

The diagonal h_res is Hyperloop's change from mHC (which uses a Sinkhorn-normalised n x n
matrix). Shared across loops: the middle layers. Loop-specific: {W, b, alpha}^{pre,post,res}_l
and e_l, i.e. L (3 n^2 d + 3 n + 3 + d) extra parameters (+401,468 -> 1421.32M at 1.4B with
n = 4, L = 4). The streams are per-token and transient: decoding keeps only KV caches, for the
begin layers ("begin"), the middle layers in every loop ("T", l) and the end layers ("end").

What the paper leaves open, and the choices made here:
- [assume] n = 4 streams, L = K = 4 loops, split 6/12/6 (a quarter / half / quarter of n_layers):
  the parameter count fixes the loop-specific sets (4 loops of 4 streams) but not the split;
  6 + 12 x 4 + 6 = 60 layer applications per token, fewer than the 96 of the other models.
- [count] The stream RMSNorm has no learnable gain (a gain would give 1421.36M).
- [assume] Init (the paper gives none; mHC uses alpha = 0.01): alpha = 0.01;
  W ~ N(0, init_std); b_pre = logit(1/n), so identical streams are read uniformly and the
  first middle input equals the begin output; b_post = 0 (h_post = 1); b_res = +3 (h_res ~ 0.95,
  close to identity; option ``res_bias``); e_l = 0.
- The backbone init is the shared one, residual outputs scaled by the unrolled depth
  n_begin + L n_middle + n_end.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from stateloop.models.baselines.common import StackedLM
from stateloop.models.baselines.options import (
    HYPERLOOP_SHARES,
    HYPERLOOP_SPLIT,
    HyperloopOptions,
    check_hyperloop_depth,
    resolve_split,
)
from stateloop.models.kernels import upcast
from stateloop.models.looped import ModelOutput


class LoopHyperConnection(nn.Module):
    """The hyper-connection of one loop: read weights, write weights, diagonal residual, e_l."""

    def __init__(self, n: int, d: int, eps: float, alpha_init: float, res_bias: float):
        super().__init__()
        self.n, self.eps = n, eps
        self.alpha_init, self.res_bias = alpha_init, res_bias
        self.W = nn.Parameter(torch.empty(3, n, n * d))  # W^pre, W^post, W^res
        self.b = nn.Parameter(torch.empty(3, n))  # b^pre, b^post, b^res
        self.alpha = nn.Parameter(torch.empty(3))  # alpha^pre, alpha^post, alpha^res
        self.loop_embed = nn.Parameter(torch.empty(d))  # e_l

    def reset_parameters(self, std: float) -> None:
        """alpha = alpha_init; W ~ N(0, std); b = (logit(1/n), 0, res_bias); e_l = 0."""
        with torch.no_grad():
            nn.init.normal_(self.W, std=std)
            self.alpha.fill_(self.alpha_init)
            self.b[0].fill_(-math.log(self.n - 1) if self.n > 1 else 30.0)  # logit(1/n); n = 1: read weight 1
            self.b[1].zero_()
            self.b[2].fill_(self.res_bias)
            self.loop_embed.zero_()

    def weights(self, Y: torch.Tensor):
        """Y (B, T, n, d) -> h_pre, h_post, h_res, each (B, T, n)."""
        flat = Y.flatten(-2)
        z = F.rms_norm(upcast(flat), (flat.shape[-1],), eps=self.eps).to(Y.dtype)  # no gain
        pre = torch.einsum("btk,gnk->btgn", z, self.W) * self.alpha[:, None] + self.b  # (B, T, 3, n)
        gates = torch.sigmoid(upcast(pre)).to(Y.dtype)
        return gates[..., 0, :], 2 * gates[..., 1, :], gates[..., 2, :]

    @staticmethod
    def read(Y: torch.Tensor, h_pre: torch.Tensor) -> torch.Tensor:
        """u = sum_j h_pre[j] Y[j]: (B, T, d)."""
        return torch.einsum("btn,btnd->btd", h_pre, Y)

    def write(self, Y: torch.Tensor, o: torch.Tensor, h_post: torch.Tensor, h_res: torch.Tensor) -> torch.Tensor:
        """Y[j] <- h_res[j] Y[j] + h_post[j] o, with o = Mid(u) + e_l already including e_l."""
        return h_res[..., None] * Y + h_post[..., None] * o[..., None, :]


class HyperloopLM(StackedLM):
    """Begin -> (hyper-connected middle block) x K -> end (see module docstring)."""

    def __init__(self, cfg, opts: HyperloopOptions | None = None):
        opts = opts or HyperloopOptions()
        n_begin, n_middle, n_end = resolve_split(cfg, opts, HYPERLOOP_SPLIT, HYPERLOOP_SHARES, "hyperloop")
        super().__init__(cfg, n_layers=n_middle)  # self.backbone: the shared middle block
        self.opts = opts
        self.n_begin, self.n_middle, self.n_end = n_begin, n_middle, n_end
        self.begin = self.unique_stack(n_begin)
        self.end = self.unique_stack(n_end)
        self.hyper = nn.ModuleList(
            LoopHyperConnection(opts.n_streams, cfg.d_model, cfg.norm_eps, opts.alpha_init, opts.res_bias)
            for _ in range(cfg.K)
        )

    @property
    def n_layer_applications(self) -> int:
        return self.n_begin + self.cfg.K * self.n_middle + self.n_end

    def loop(self, h, rope, cache) -> ModelOutput:
        x_b = self.apply_stack(self.begin, h, rope, cache, ("begin",))
        Y = x_b[..., None, :].expand(*x_b.shape[:-1], self.opts.n_streams, x_b.shape[-1])  # n copies
        for l in range(self.cfg.K):
            Y = self.hyper_loop(l, Y, rope, cache)  # Y^{l+1}
        out = self.apply_stack(self.end, Y.mean(dim=-2), rope, cache, ("end",))
        return ModelOutput(hidden=out)

    def hyper_loop(self, l: int, Y: torch.Tensor, rope, cache) -> torch.Tensor:
        """Loop l: Y^l -> Y^{l+1} through its hyper-connection and the shared middle block."""
        hc = self.hyper[l]
        h_pre, h_post, h_res = hc.weights(Y)
        o = self.apply_backbone(hc.read(Y, h_pre), rope, cache, l) + hc.loop_embed
        return hc.write(Y, o, h_post, h_res)

    checkpoint_units = {"iteration": (hyper_loop,)}
    depth_check = staticmethod(check_hyperloop_depth)
    per_iteration = ("hyper",)  # loop l's hyper-connection and e_l
