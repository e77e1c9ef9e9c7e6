"""Compute of a model counted from its config: FLOPs and layer applications per token.

The count comes from running the real forward and backward pass on the meta device under
``torch.utils.flop_counter.FlopCounterMode`` (through Lightning's ``measure_flops``): every matmul, attention and scan the model really
performs is counted, loop iterations included (a K-times looped model counts K backbone
applications, Pause Token its 4 positions per real token), and nothing is allocated.
Elementwise work (norms, activations, the state update) is not counted, as is usual for MFU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from lightning_fabric.utilities.throughput import measure_flops

from stateloop.models.backbone import Layer
from stateloop.models.registry import build_model


@dataclass
class ComputeProfile:
    flops_per_token: float  # training (forward + backward) matmul FLOPs per real token
    layer_applications_per_token: float  # decoder-layer applications per real token (unrolled depth)


def compute_profile(cfg, seq_len: int) -> ComputeProfile:

    cfg = dataclasses.replace(cfg, attn_impl="torch", ssd_impl="torch")
    model = build_model(cfg, device="meta")
    positions = [0]

    def count(module, args, output):
        positions[0] += args[0].shape[0] * args[0].shape[1]

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, Layer)]
    idx = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    try:  # Lightning's counter: FlopCounterMode over the forward and the loss's backward
        flops = measure_flops(model, lambda: model(idx).logits, lambda logits: logits.float().sum())
    finally:
        for h in hooks:
            h.remove()
    return ComputeProfile(flops / seq_len, positions[0] / seq_len)
