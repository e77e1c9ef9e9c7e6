"""The training loss, eq. (12): the mean next-token cross-entropy of a micro-batch, in one place.

``train.loss_chunk_tokens`` = 0 (the reference): the model's logits (B, T, V) at once, in float32,
then the cross-entropy (tests/train/test_golden.py holds it bit for bit).

``train.loss_chunk_tokens`` = N > 0: the model returns Y, the head's input (B, T, d), and the head
W_o RMSNorm_f (eq. 11) and the cross-entropy run over N tokens at a time, each chunk one checkpoint
unit, so at most one chunk's (N, V) logits exist at a time. The mean is the reference's in another
order of additions (equal within float rounding: tests/train/test_loss.py). It runs inside the
model's forward (``LoopedLM.forward``'s ``loss_fn``), where FSDP has gathered the head.

[choice] Under bf16 autocast the chunks' gradients of W_o add up on autocast's bf16 copy of it (one
copy per forward, shared by the chunks), as the K iterations' gradients of every shared backbone
weight already do; the reference rounds its single product once. They differ by about one bf16 ulp
of the gradient's largest entries (tests/train/test_loss.py). A float32 sum would need a cast of W_o
of each chunk's own, outside the model's head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # F.cross_entropy's default: a target never counted


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, chunk_tokens: int = 0) -> torch.Tensor:
    """Eq. (12): the mean next-token cross-entropy of ``model`` on inputs x (B, T) with targets
    y (B, T), a float32 scalar. ``chunk_tokens`` = 0: from the whole logits at once (the reference);
    N > 0: N tokens at a time (module docstring). ``model`` is the model or Fabric's wrapper of it."""
    if chunk_tokens <= 0:
        logits = model(x).logits  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
    return model(x, loss_fn=ChunkedCrossEntropy(y, chunk_tokens)).loss


class ChunkedCrossEntropy:
    """``loss_fn`` of ``LoopedLM.forward``: (model, Y (B, T, d)) -> the mean cross-entropy of the
    model's head on Y against ``targets`` (B, T), ``chunk_tokens`` tokens at a time."""

    def __init__(self, targets: torch.Tensor, chunk_tokens: int):
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.targets, self.chunk_tokens = targets, chunk_tokens

    def __call__(self, model, Y: torch.Tensor) -> torch.Tensor:
        targets = self.targets.flatten()
        # One split, not a slice per chunk: backward gathers the chunks' gradients of Y in one copy
        chunks = zip(Y.flatten(0, 1).split(self.chunk_tokens), targets.split(self.chunk_tokens))
        total = None
        for y, t in chunks:
            part = checkpoint(summed_nll, model.lm_head, y, t, use_reentrant=False)
            total = part if total is None else total + part
        return total / (targets != IGNORE_INDEX).sum()


def summed_nll(head, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The summed cross-entropy of one chunk: its logits (n, V) in float32, as the reference's."""
    return F.cross_entropy(head(y).float(), t, reduction="sum")
