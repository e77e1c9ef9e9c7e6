"""What one training forward keeps for backward: the bytes autograd saves, measured on a real forward.

:func:`saved_bytes` runs the forward and the loss as the training step does (train/loss.py) under a
precision, a checkpointing level and a loss chunk size, and returns the bytes of every distinct
storage autograd saved, the parameters excluded: the activation memory at a step's peak (backward's
transient buffers come on top). Under ``bf16-mixed`` that includes autocast's weight copies, the
part that does not grow with the batch. :func:`activation_bytes` separates the per-token and fixed
parts from two probes (batch 1 and 2); :func:`layer_application_bytes` gives one decoder-layer
application's bytes per token. Every saved tensor of these models is O(T) per sequence, so the
per-token figures do not depend on the probe's sequence length; they do depend on the device's
kernels.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from stateloop.models.registry import build_model
from stateloop.train.checkpointing import checkpointed
from stateloop.train.loss import lm_loss

MIXED = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
TRUE = {"32-true": torch.float32, "bf16-true": torch.bfloat16, "64-true": torch.float64}


class SavedTensorBytes:
    """A context in which every tensor autograd saves for backward is recorded; ``.bytes`` is the sum
    over their distinct storages (a tensor saved twice, or a view of a saved tensor, counts once), the
    storages of ``exclude`` (the parameters) left out. Each recorded storage is held until the context
    ends: a saved tensor that autograd frees early (a discarded branch of the graph) would otherwise
    leave its address to a later one, which the count would then take for the same storage and miss
    (seen as a count that changed from run to run by up to 1%)."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}  # data pointer -> bytes
        self._held: list = []  # the recorded storages, alive until the context ends
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.exclude and ptr not in self.storages:
            self.storages[ptr] = storage.nbytes()
            self._held.append(storage)
        return t

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> SavedTensorBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._held.clear()


def precision_context(precision: str, device_type: str):
    """The forward's context under a ``train.precision`` (autocast for the mixed ones, as Fabric's
    plugin does), and the parameters' dtype."""
    if precision in MIXED:
        return torch.autocast(device_type, dtype=MIXED[precision]), torch.float32
    if precision in TRUE:
        return contextlib.nullcontext(), TRUE[precision]
    raise ValueError(f"precision: one of {', '.join([*MIXED, *TRUE])}, got {precision!r}")


def saved_bytes(cfg, *, batch: int, seq_len: int, precision: str = "bf16-mixed", activation_checkpointing: str = "none",
                loss_chunk_tokens: int = 0, device: str | torch.device = "cpu", model=None, seed: int = 0) -> int:
    """Bytes autograd saves for backward in one training forward and loss of the model ``cfg``
    (a ModelConfig) on a micro-batch of ``batch`` x ``seq_len`` random tokens: the distinct storages
    of every saved tensor, the parameters excluded (module docstring). ``precision`` is a
    ``train.precision`` other than "auto" (bf16-mixed: autocast); ``activation_checkpointing`` and
    ``loss_chunk_tokens`` are the ``train`` keys. ``model``: an already built model of ``cfg`` on
    ``device`` (in the parameters' dtype of ``precision``), to probe several settings without
    building it again; its checkpointing level is restored afterwards. No backward is run."""
    device = torch.device(device)
    context, dtype = precision_context(precision, device.type)
    if model is None:
        model = build_model(cfg, device=device).to(dtype)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len + 1), generator=generator).to(device)
    with checkpointed(model, activation_checkpointing), SavedTensorBytes(exclude=model.parameters()) as saved, context:
        loss = lm_loss(model, tokens[:, :-1], tokens[:, 1:], loss_chunk_tokens)
    count = saved.bytes
    del loss  # frees the graph, and every saved tensor with it
    return count


@dataclass(frozen=True)
class ActivationBytes:
    per_token: float  # bytes per token of the micro-batch (batch x seq_len tokens)
    fixed: float  # bytes that do not grow with the batch (autocast's weight copies, mostly)

    def at(self, tokens: int) -> float:
        """Saved bytes of a micro-batch of ``tokens`` tokens."""
        return self.fixed + self.per_token * tokens


def activation_bytes(cfg, *, seq_len: int, model=None, **settings) -> ActivationBytes:
    """:func:`saved_bytes` at batch 1 and 2 (the same ``seq_len`` and ``settings``), split into bytes
    per token and fixed bytes. Exact where every saved tensor is per token or per weight, as in these
    models; a loss chunk size below ``seq_len`` keeps that true."""
    device = settings.get("device", "cpu")
    if model is None:
        _, dtype = precision_context(settings.get("precision", "bf16-mixed"), torch.device(device).type)
        model = build_model(cfg, device=device).to(dtype)
    one, two = (saved_bytes(cfg, batch=b, seq_len=seq_len, model=model, **settings) for b in (1, 2))
    per_token = (two - one) / seq_len
    return ActivationBytes(per_token, one - per_token * seq_len)


def layer_application_bytes(cfg, *, seq_len: int, **settings) -> float:
    """Bytes per token that one decoder-layer application keeps: the per-token bytes of ``cfg`` with
    one more layer, less those of ``cfg``, over the layer applications per token the layer adds (K for
    the looped models). A model whose unrolled depth does not follow ``n_layers`` (the baselines'
    explicit splits) is refused."""
    more = dataclasses.replace(cfg, n_layers=cfg.n_layers + 1)
    models = [build_model(c, device="meta") for c in (cfg, more)]
    added = models[1].n_layer_applications - models[0].n_layer_applications
    if added <= 0:
        raise ValueError(f"{cfg.name}: one more layer adds no layer application (its layer split is explicit)")
    base, bigger = (activation_bytes(c, seq_len=seq_len, **settings).per_token for c in (cfg, more))
    return (bigger - base) / added
