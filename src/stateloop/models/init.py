"""Weight initialisation of every model, in one place.

Rules (the paper gives only the StateLoop cell's init; the rest are our documented choices,
following the LLaMA / GPT-2 convention that the baselines' recipes also use):

- ``nn.Linear`` and ``nn.Embedding`` weights: N(0, init_std) (init_std = 0.02 by default).
- Residual-output projections (attention W_o, SwiGLU W_down, Mamba-2 out_proj; flagged with
  ``residual_out = True``), by ``model.init_scheme``: "depth_scaled" (default) N(0, init_std /
  sqrt(2 N)), N = layer applications per token of the unrolled model
  (``model.n_layer_applications``: K x L for a looped model, 96 at 1.4B), so the residual
  stream's variance does not grow with the loop depth; "plain" N(0, init_std) like every other
  Linear, as transformers' ``LlamaForCausalLM._init_weights`` initialises the authors' backbones
  (LUMIA-Group/PonderLM-2, ``llama_config/*/config.json``: ``initializer_range``).
- RMSNorm gains: 1.
- StateLoop cell (paper): W_Delta = 0, b_Delta = log(e^0.3 - 1) (softplus(b_Delta) = 0.3),
  lambda = exp(A_log) log-spaced from 0.01 to 4 over the d_s channels; W_u: N(0, init_std).
  The read projections W_{s->z}, W_{s->out} (``model.read_init``, a choice the paper leaves
  open): "residual" (default) like the residual-output projections (so N(0, init_std) under the
  plain scheme), because each read is a term added to the residual stream, the role W_o and W_down play; "input"
  N(0, init_std) like input projections, under which each read adds at init a term as large as
  the embedding itself. Both were trained with seeds (docs/results.md, "The read projections' init").
- GRU cell: PyTorch's default U(-1/sqrt(d_s), 1/sqrt(d_s)).
- Mamba-2 mixer: mamba_ssm's init (dt log-uniform in [1e-3, 1e-1], A uniform in [1, 16], D = 1,
  convolution with PyTorch's default).
- Modules with their own ``reset_parameters(std)`` (cells, Mamba-2, baseline-specific
  parameters, or the model itself for its own parameters) are initialised by it after the generic
  rules; their docstrings list the values.
"""

from __future__ import annotations

import math

import torch.nn as nn

from stateloop.models.backbone import RMSNorm
from stateloop.models.mixers import GatedRMSNorm


def init_weights(model: nn.Module) -> nn.Module:
    cfg = model.cfg
    std = cfg.init_std
    std_out = std / math.sqrt(2 * model.n_layer_applications) if cfg.init_scheme == "depth_scaled" else std
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std_out if getattr(module, "residual_out", False) else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, (RMSNorm, GatedRMSNorm)):
            nn.init.ones_(module.weight)
    # Specific inits last, so they win over the generic rules above.
    for module in model.modules():
        if hasattr(module, "reset_parameters") and not isinstance(
            module, (nn.Linear, nn.Embedding, nn.Conv1d, nn.GRUCell)
        ):
            module.reset_parameters(std)
    # Residual-output projections inside modules with their own reset keep the depth scaling.
    for module in model.modules():
        if isinstance(module, nn.Linear) and getattr(module, "residual_out", False):
            nn.init.normal_(module.weight, std=std_out)
    return model
