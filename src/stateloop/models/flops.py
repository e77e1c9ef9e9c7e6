"""Compute of a model counted from its config: FLOPs and layer applications per token.

The count comes from running the real forward and backward pass on the meta device under
``torch.utils.flop_counter.FlopCounterMode``: every matmul, attention and convolution the model
really performs is counted, loop iterations included (a K-times looped model counts K backbone
applications, Pause Token its 4 positions per real token), and nothing is allocated.
Elementwise work (norms, activations, the state update) is not counted, as is usual for MFU.

One formula is torch's own mistake and replaced here: torch's ``convolution_backward`` formula
treats the weight gradient of a grouped convolution as a dense one (it ignores ``groups``), so
Mamba-2's depthwise conv1d would count C times its real work (C = its 2,304 channels at 1.4B).
:func:`conv_backward_flop` counts each gradient (input, weight) as the forward convolution's
multiply-adds, which is exact for any ``groups`` (tests/models/test_flops.py checks every model
against an analytic count).

:func:`decode_flops_per_token` counts one decoded token the same way (a cached single-token
step on the meta device): the FLOP share that Table 3's latency changes are set beside. The
decoding step's convolution window is an elementwise multiply-add (``kernels.conv1d_step``) and
is not counted, like the norms (2 W C FLOPs per Mamba-2 step, W = 4 taps of C = d_in + 2GN
channels: under 0.5% of that step's matmuls).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode, bmm_flop, conv_flop_count

from stateloop.models.backbone import Layer
from stateloop.models.cache import ModelCache
from stateloop.models.registry import build_model

aten = torch.ops.aten


@dataclass
class ComputeProfile:
    flops_per_token: float  # training (forward + backward) matmul FLOPs per real token
    layer_applications_per_token: float  # decoder-layer applications per real token (unrolled depth)


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed, _output_padding,
                       _groups, output_mask, out_shape=None, **kwargs) -> int:
    """``aten.convolution_backward``: each requested gradient (of the input, of the weight) takes as
    many multiply-adds as the forward convolution, 2 * batch * positions * C_out * (C_in / groups) *
    kernel (``w_shape[1]`` is already C_in / groups, so grouped convolutions are counted right)."""
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
    return forward * (int(output_mask[0]) + int(output_mask[1]))


def baddbmm_flop(_self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """The in-place ``baddbmm_`` (Mamba-2's decoding state update, models/kernels.py), which torch
    does not count: the batched product's multiply-adds, as for ``baddbmm``."""
    return bmm_flop(a_shape, b_shape)


FLOP_FORMULAS = {aten.convolution_backward: conv_backward_flop, aten.baddbmm_: baddbmm_flop}


def counter() -> FlopCounterMode:
    """torch's FLOP counter with this module's formulas (FLOP_FORMULAS)."""
    return FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)


def _meta_model(cfg):
    cfg = dataclasses.replace(cfg, attn_impl="torch", ssd_impl="torch")
    return build_model(cfg, device="meta")


def compute_profile(cfg, seq_len: int) -> ComputeProfile:
    """Training FLOPs (forward and the loss's backward) and layer applications per token of one
    sequence of ``seq_len`` tokens."""
    model = _meta_model(cfg)
    positions = [0]

    def count(module, args, output):
        positions[0] += args[0].shape[0] * args[0].shape[1]

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, Layer)]
    idx = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    try:
        with counter() as c:
            model(idx).logits.float().sum().backward()
    finally:
        for h in hooks:
            h.remove()
    return ComputeProfile(c.get_total_flops() / seq_len, positions[0] / seq_len)


def decode_flops_per_token(cfg, context: int) -> int:
    """FLOPs of decoding one token at batch 1 with ``context`` tokens already cached (the
    prefill and earlier steps), counted on the meta device."""
    model = _meta_model(cfg).eval()
    cache = ModelCache()
    with torch.inference_mode():
        if context:
            model(torch.zeros(1, context, dtype=torch.long, device="meta"), cache=cache)
        with counter() as c:
            model(torch.zeros(1, 1, dtype=torch.long, device="meta"), cache=cache)
    return c.get_total_flops()
