"""Compute of a model counted from its config: FLOPs per token of a forward(+backward) pass.

The count comes from running the real forward pass on the meta device under
``torch.utils.flop_counter.FlopCounterMode``: every matmul, attention and scan the model really
performs is counted, loop iterations included (a K-times looped model counts K backbone
applications), and nothing is allocated. Backward is counted by autograd in the same way.
Elementwise work (norms, activations, the state update) is not counted, as is usual for MFU.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils.flop_counter import FlopCounterMode


def flops_per_token(cfg, seq_len: int, backward: bool = True) -> float:
    """Matmul FLOPs per token of one training step (forward + backward) at ``seq_len``."""
    from stateloop.models.registry import build_model

    cfg = dataclasses.replace(cfg, attn_impl="torch", ssd_impl="torch")
    model = build_model(cfg, device="meta")
    idx = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(idx).logits
        if backward:
            logits.float().sum().backward()
    return counter.get_total_flops() / seq_len
