"""Compute of a model counted from its config: FLOPs and layer applications per token.

The real forward and backward run on the meta device under ``FlopCounterMode``: every matmul and
attention product is counted, loop iterations included, and nothing is allocated. Elementwise
work (norms, activations, the state update, Mamba-2's causal convolution and its SSD chunk carry)
is not counted, as is usual for MFU ([choice], docs/choices.md). :func:`decode_flops_per_token`
writes out one decoded token's count, which :func:`counted_decode_flops` checks.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, bmm_flop, sdpa_flop_count

from stateloop.models import counted
from stateloop.models.backbone import Layer
from stateloop.models.cache import ModelCache
from stateloop.models.looped import matched_ffn_width
from stateloop.models.registry import build_model

aten = torch.ops.aten


@dataclass(frozen=True)
class ComputeProfile:
    flops_per_token: float  # training (forward + backward) matmul FLOPs per real token
    layer_applications_per_token: float  # decoder-layer applications per real token (unrolled depth)


def baddbmm_flop(_self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """The in-place ``baddbmm_`` (Mamba-2's decoding state update, models/kernels.py), which torch
    does not count: the batched product's multiply-adds, as for ``baddbmm``."""
    return bmm_flop(a_shape, b_shape)


def cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """The CPU flash-attention kernel's forward, counted as torch counts the CUDA kernels'."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def cpu_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """Its backward: the four gradient products, twice the forward's (the meta device's math path,
    without the flash kernels' recomputation that torch's CUDA formula adds)."""
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


# torch counts CUDA's fused attention kernels but not the CPU's flash kernel (QK^T and AV were missing).
FLOP_FORMULAS = {
    aten.baddbmm_: baddbmm_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_sdpa_backward_flop,
}


def counter() -> FlopCounterMode:
    """torch's FLOP counter with this module's formulas (FLOP_FORMULAS)."""
    return FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)


def meta_model(cfg):
    """``cfg``'s model on the meta device with the torch kernels, in training mode (an eval-mode Parcae
    reads positions as numbers, which the meta device has not; both modes run the same matmuls)."""
    cfg = dataclasses.replace(cfg, attn_impl="torch", ssd_impl="torch")
    return build_model(cfg, device="meta")


def compute_profile(cfg, seq_len: int) -> ComputeProfile:
    """Training FLOPs (forward and the loss's backward) and layer applications per token of one
    sequence of ``seq_len`` tokens; counted once for each (config, ``seq_len``) and kept in
    models/counted.py's table (on disk too where a command swapped in ops/measured.py's)."""
    name = json.dumps([dataclasses.asdict(cfg), seq_len], sort_keys=True, default=repr)
    found = counted.PROFILES.get(name)
    if found is None:
        found = counted.PROFILES[name] = dataclasses.asdict(_count_profile(cfg, seq_len))
    return ComputeProfile(**found)


def _count_profile(cfg, seq_len: int, stand_ins: bool = True) -> ComputeProfile:
    """The count of :func:`compute_profile`. With ``stand_ins``, a decoder layer's forward and
    backward are counted once per (weights' shapes, inputs' shapes) and each application adds that
    count, passing its input on: the whole model's count (``stand_ins=False``;
    tests/models/test_flops.py) in a fraction of the time."""
    from torch.utils._python_dispatch import _disable_current_modes

    model = meta_model(cfg)
    positions = [0]
    added = [0]
    memo: dict[tuple, int] = {}

    def shape_of(a):
        if isinstance(a, torch.Tensor):
            return tuple(a.shape), str(a.dtype)
        if hasattr(a, "__dict__"):  # RoPE's tables
            return tuple(shape_of(v) for v in vars(a).values() if isinstance(v, torch.Tensor))
        return repr(a)

    def wrap(layer):
        forward = layer.forward
        weights = tuple(tuple(p.shape) for p in layer.parameters())

        def counted(x, *args, **kwargs):
            positions[0] += x.shape[0] * x.shape[1]
            if not stand_ins:
                return forward(x, *args, **kwargs)
            key = (weights, shape_of(x), tuple(shape_of(a) for a in args), tuple(sorted((k, shape_of(v)) for k, v in kwargs.items())))
            if key not in memo:
                with _disable_current_modes(), counter() as c:
                    x_own = x.detach().requires_grad_(True)
                    y = forward(x_own, *args, **kwargs)
                    y.backward(torch.ones_like(y))
                memo[key] = c.get_total_flops()
                for p in layer.parameters():
                    p.grad = None
            added[0] += memo[key]
            return x.clone()

        layer.forward = counted

    for m in model.modules():
        if isinstance(m, Layer):
            wrap(m)
    idx = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    with counter() as c:
        model(idx).logits.float().sum().backward()
    return ComputeProfile((c.get_total_flops() + added[0]) / seq_len, positions[0] / seq_len)


# The models whose decoded token decode_flops_per_token counts: Table 3's rows and the cell ablations.
DECODE_MIXERS = {"vanilla_looped": None, "vanilla_looped_ffn": None, "stateloop": "identity", "reset_state": "identity",
                 "stateloop_attn": "attn", "stateloop_mamba2": "mamba2"}


def decode_flops_per_token(cfg, context: float) -> float | None:
    """FLOPs of decoding one token at batch 1 after ``context`` cached tokens, written out from the
    config (equal to the meta count, tests/models/test_flops.py); linear in ``context``, so a
    fractional one gives the mean over steps. None for models other than DECODE_MIXERS."""
    if cfg.name not in DECODE_MIXERS:
        return None
    d, inner, keys = cfg.d_model, cfg.n_heads * cfg.head_dim, context + 1
    f = cfg.d_ff
    if cfg.name == "vanilla_looped_ffn":
        f = cfg.options.get("d_ff") or matched_ffn_width(cfg)
    total = cfg.K * cfg.n_layers * (2 * (4 * d * inner + 3 * d * f) + 4 * keys * inner) + 2 * d * cfg.vocab_size
    mixer, d_s = DECODE_MIXERS[cfg.name], cfg.d_s
    if mixer is None:
        return total
    step = 2 * d * 2 * d_s + 2 * d_s * d  # W_u and W_Delta; one read (K - 1 feedback, 1 terminal)
    if mixer == "attn":
        m = cfg.mixer_heads * cfg.mixer_head_dim
        step += 2 * 4 * d_s * m + 4 * keys * m
    elif mixer == "mamba2":
        d_in, G, N = cfg.mamba_expand * d_s, cfg.mamba_n_groups, cfg.mamba_d_state
        step += 2 * d_s * (2 * d_in + 2 * G * N + d_in // cfg.mamba_head_dim) + 2 * 2 * d_in * N + 2 * d_in * d_s
    return total + cfg.K * step


def counted_decode_flops(cfg, context: int) -> int:
    """The FLOPs of one cached single-token step after ``context`` tokens, as the counter sees them."""
    model = meta_model(cfg).eval()
    cache = ModelCache()
    with torch.inference_mode():
        if context:
            model(torch.zeros(1, context, dtype=torch.long, device="meta"), cache=cache)
        with counter() as c:
            model(torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache)
    return c.get_total_flops()
