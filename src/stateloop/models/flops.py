"""Compute of a model counted from its config: FLOPs and layer applications per token.

The count comes from running the real forward and backward pass on the meta device under
``torch.utils.flop_counter.FlopCounterMode``: every matmul and attention product the model
really performs is counted, loop iterations included (a K-times looped model counts K backbone
applications, Pause Token its 4 positions per real token), and nothing is allocated.
Elementwise work (norms, activations, the state update) is not counted, as is usual for MFU
([choice], docs/choices.md). Nor are two pieces of Mamba-2's pure-PyTorch twin that are
elementwise multiply-adds: its depthwise causal convolution (W shifted multiply-adds,
``kernels.causal_conv1d_ref``; 2 W C FLOPs per token and pass, W = 4 taps of C = d_in + 2GN
channels, about 0.25% of the mixer's matmuls at d_s = 512) and the carry of states across the
SSD's chunks (``ssd.ssd_chunked``). Neither is a matmul on the GPU either (causal-conv1d's and
mamba_ssm's kernels).

:func:`decode_flops_per_token` counts one decoded token from the config, equal to what the
counter sees in a cached single-token step (:func:`counted_decode_flops`): the FLOP share that
Table 3's latency changes are set beside. The decoding step's convolution window is an
elementwise multiply-add (``kernels.conv1d_step``) and is not counted either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, bmm_flop, sdpa_flop_count

from stateloop import measured
from stateloop.models.backbone import Layer
from stateloop.models.cache import ModelCache
from stateloop.models.registry import build_model, matched_ffn_width

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
    """Its backward: the four gradient products (of the scores, V, Q and K), twice the forward's.
    Not the flash kernels' recomputation of the scores, which torch's CUDA formula adds: the count
    is the one the meta device's math path gives, which every other count here (compute_profile) is."""
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


# torch counts the fused attention kernels of CUDA (flash, efficient, cuDNN) but not the CPU's flash
# kernel, which F.scaled_dot_product_attention takes on CPU tensors: counted on the CPU, attention's
# QK^T and AV were missing (on the meta device they run as the math path's bmm and were counted). The
# CPU kernel's forward and backward take their shapes in the same order as the CUDA flash kernel's.
FLOP_FORMULAS = {
    aten.baddbmm_: baddbmm_flop,
    aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_sdpa_backward_flop,
}


def counter() -> FlopCounterMode:
    """torch's FLOP counter with this module's formulas (FLOP_FORMULAS)."""
    return FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)


def _meta_model(cfg):
    cfg = dataclasses.replace(cfg, attn_impl="torch", ssd_impl="torch")
    return build_model(cfg, device="meta")


# compute_profile's counts by (config, seq_len): a count takes seconds at a deep shape (the meta
# forward and backward under the counter: about 1.9 CPU-s for a 12-layer, K = 7 model), and the
# runs of a config repeat shapes (every seed of a cell has the same model config), so each shape is
# counted once per process, and kept on disk (stateloop/measured.py, kind "flops": named by the
# config, seq_len and the digest of the models' code, this module's among them, and torch's
# version), so that `stateloop plan` called again counts nothing.
_PROFILES: dict[str, ComputeProfile] = {}


def compute_profile(cfg, seq_len: int) -> ComputeProfile:
    """Training FLOPs (forward and the loss's backward) and layer applications per token of one
    sequence of ``seq_len`` tokens; counted once for each (config, ``seq_len``, code) and kept."""
    name = measured.key(dataclasses.asdict(cfg), seq_len, measured.code_digest())
    if name not in _PROFILES:
        found = measured.load("flops", name)
        if found is None:
            found = dataclasses.asdict(_count_profile(cfg, seq_len))
            measured.store("flops", name, found)
        _PROFILES[name] = ComputeProfile(**found)
    return _PROFILES[name]


def _count_profile(cfg, seq_len: int, stand_ins: bool = True) -> ComputeProfile:
    """The count of :func:`compute_profile`. With ``stand_ins``, a decoder layer's application is
    counted once per (its weights' shapes, its inputs' shapes), on its own: its forward and its
    backward (the gradients of the input and the weights, as inside the model, where every layer's
    input requires a gradient); every application then adds that count and passes its input on as
    a copy, so the counter walks the rest of the model (embedding, head, state branch, mixers) and
    only one application per shape (the looped stack's K x L are alike). The same count as the
    whole model under the counter (``stand_ins=False``; tests/models/test_flops.py), in a fraction
    of the time: the counter's cost is per operator, not per FLOP, at any width."""
    from torch.utils._python_dispatch import _disable_current_modes

    model = _meta_model(cfg)
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
    """FLOPs of decoding one token at batch 1 with ``context`` tokens already cached, written out
    from the config (a count on the meta device takes seconds per model at Table 3's depth; the
    two agree exactly, tests/models/test_flops.py). Per backbone application, L layers of
    q, k, v, o, SwiGLU and QK^T, AV over context + 1 keys; the head once; per iteration of the
    state branch W_u, W_Delta and a read, plus the mixer: attention's q, k, v, o and its own
    QK^T, AV; Mamba-2's in_proj, state update (dt x) B^T, read H C and out_proj (its conv window
    is elementwise). The count is linear in ``context``, so a fractional context gives the mean
    over steps. None for models other than DECODE_MIXERS."""
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
    """The FLOPs of one decoded token as the counter sees them: a cached single-token step on the
    meta device after a prefill of ``context`` tokens (the check of :func:`decode_flops_per_token`)."""
    model = _meta_model(cfg).eval()
    cache = ModelCache()
    with torch.inference_mode():
        if context:
            model(torch.zeros(1, context, dtype=torch.long, device="meta"), cache=cache)
        with counter() as c:
            model(torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache)
    return c.get_total_flops()
