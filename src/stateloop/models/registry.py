"""The model registry: one name -> one builder. The single spelling of every model name.

Names are lowercase ``[a-z0-9_]+`` and are used unchanged in configs, run folders, Snakemake
wildcards, MLflow run names and tables. Variant-specific knobs live in ``model.options`` and
are checked against the variant's options dataclass, so a bad key fails before anything runs.

The registry names what a config check reads about a model: its name, label, whether it has a
state, its options dataclass and their checks, and the test-time depths it refuses; the options and
checks themselves live beside each model, torch-free (models/options.py, models/baselines/options.py),
and the registry knows nothing else of a model. It imports no torch, so the Snakefile, ``stateloop
plan`` and every config check read it without loading torch and the model modules: a spec names its
model class, imported when a model is built (:func:`build_model` and :func:`count_params` need torch).
The model modules never import the registry (tests/test_layers.py: no import cycle).

Every model maps token ids (B, T) to next-token logits (B, T, V) through
``model(idx, cache=None) -> ModelOutput`` and can be built on the meta device for counting.
Every model is a :class:`~stateloop.models.looped.LoopedLM`: its one ``forward`` calls the
model's ``inputs`` and ``loop`` hooks (see that class's docstring).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stateloop.config import ConfigError, from_dict
from stateloop.config.model import ModelConfig
from stateloop.models.baselines.options import (
    HyperloopOptions,
    MeshOptions,
    ParcaeOptions,
    PauseTokenOptions,
    PonderLMOptions,
    check_hyperloop,
    check_hyperloop_depth,
    check_mesh,
    check_mesh_depth,
    check_parcae,
    check_pause_token,
    check_pause_token_depth,
)
from stateloop.models.options import FFNOptions

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model: str  # its model class's name (:func:`model_classes`), imported (with torch) by build only
    label: str  # the row label the paper prints
    has_state: bool  # a persistent state of width d_s (run folders carry ds{d_s})
    options: type | None = None  # dataclass of model.options, or None (no options allowed)
    description: str = ""
    validate: Callable | None = None  # extra shape checks: (ModelConfig, options) -> None
    depth: Callable | None = None  # (trained ModelConfig, K) -> None, refusing a K; None: every K (the class's depth_check)
    state_at_d_model: bool = False  # the state is the backbone's input, so d_s must be d (state only)
    variant: dict = dataclasses.field(default_factory=dict)  # the model class's keyword arguments

    def build(self, cfg: ModelConfig, opts):
        cls = model_classes()[self.model]
        return cls(cfg, **self.variant) if self.options is None else cls(cfg, opts, **self.variant)

    def parse_options(self, cfg: ModelConfig):
        if self.options is None:
            if cfg.options:
                raise ConfigError(f"model.options.{next(iter(cfg.options))}: unknown key ({self.name} takes no options)")
            return None
        return from_dict(self.options, cfg.options, "model.options")

    def width(self, d_s: int) -> int:
        """The state width a run of this model takes from an experiment's width ``d_s``: that width
        for a model with a state, 0 for one without (an experiment lists widths for the former)."""
        return d_s if self.has_state else 0

    def check_width(self, cfg: ModelConfig) -> None:
        """The state width ``model.d_s`` of a config of this model, checked here only (the config,
        the pipeline, the run id and the model classes take it as given): positive for a model with
        a state, 0 for one without, and d for state only. A bad width is one line naming the key."""
        if self.has_state and cfg.d_s <= 0:
            raise ConfigError(f"model.d_s: {self.name} needs a positive state width d_s, got {cfg.d_s}")
        if not self.has_state and cfg.d_s != 0:
            raise ConfigError(f"model.d_s: {self.name} has no persistent state, so d_s must be 0 "
                              f"(ds0 in its run ids), got {cfg.d_s}")
        if self.state_at_d_model and cfg.d_s != cfg.d_model:
            raise ConfigError(f"model.d_s: {self.name} keeps the state at the model width d={cfg.d_model}, got {cfg.d_s}")

    def check(self, cfg: ModelConfig) -> None:
        """The config's checks before a build: the state width (:meth:`check_width`), the options
        and the variant's own shape checks."""
        self.check_width(cfg)
        opts = self.parse_options(cfg)
        if self.validate is not None:
            self.validate(cfg, opts)

    def check_depth(self, trained: ModelConfig, K: int) -> None:
        """Refuse (ConfigError, one line) a test-time depth K at which a model of config ``trained``
        (its trained K) has no meaning: the check of ``LoopedLM.at_depth``, and of a config's
        ``test_time_K`` before any model is built (pipeline.check_depths): the same function as the
        model class's ``depth_check``. Without ``depth``, every K: the loop shares one weight set
        across iterations."""
        if self.depth is not None:
            self.depth(trained, K)


def model_classes() -> dict[str, type]:
    """The model classes by name, imported on a build: they need torch, which a config check does not
    load (import statements, not names in strings: the Hugging Face export bundles the modules these
    lines import, export/hf.py). The model modules never import this registry."""
    from stateloop.models.baselines.hyperloop import HyperloopLM  # torch
    from stateloop.models.baselines.mesh import MeshLM  # torch
    from stateloop.models.baselines.parcae import ParcaeLM  # torch
    from stateloop.models.baselines.pause_token import PauseTokenLM  # torch
    from stateloop.models.baselines.ponderlm import PonderLM  # torch
    from stateloop.models.looped import LoopedLM, StateLoopLM, StateOnlyLM, WideFFNLoopedLM  # torch

    return {c.__name__: c for c in (LoopedLM, WideFFNLoopedLM, StateLoopLM, StateOnlyLM, HyperloopLM, MeshLM, ParcaeLM,
                                    PauseTokenLM, PonderLM)}


_SPECS = [
    ModelSpec("vanilla_looped", "LoopedLM", "Vanilla Looped", False,
              description="one shared backbone applied K times"),
    ModelSpec("vanilla_looped_ffn", "WideFFNLoopedLM", "Vanilla Looped + FFN", False, FFNOptions,
              description="Vanilla Looped with a wider SwiGLU, parameter-matched to StateLoop + Mamba-2"),
    ModelSpec("stateloop", "StateLoopLM", "StateLoop", True,
              description="persistent state, selective-SSM update, identity mixer (eqs. 1-7, 10-12)"),
    ModelSpec("stateloop_attn", "StateLoopLM", "StateLoop + Attention", True,
              description="StateLoop with causal attention over the state (eq. 8)", variant={"mixer": "attn"}),
    ModelSpec("stateloop_mamba2", "StateLoopLM", "StateLoop + Mamba-2", True,
              description="StateLoop with a Mamba-2 block over the state (eq. 9)", variant={"mixer": "mamba2"}),
    ModelSpec("state_only", "StateOnlyLM", "State only", True,
              description="the gated state alone is the next backbone input; no state reads (eq. 13)",
              state_at_d_model=True),
    ModelSpec("reset_state", "StateLoopLM", "Reset state", True,
              description="the state is reset before every update (eq. 14)", variant={"reset": True}),
    ModelSpec("stateloop_gru", "StateLoopLM", "GRU update", True,
              description="a GRU cell replaces the selective-SSM update (eq. 6)", variant={"update": "gru"}),
    # The paper's baselines (models/baselines/, docs/baselines.md).
    ModelSpec("hyperloop", "HyperloopLM", "Hyperloop", False, HyperloopOptions, validate=check_hyperloop,
              description="begin / middle x K / end blocks, n residual streams with loop-level hyper-connections",
              depth=check_hyperloop_depth),
    ModelSpec("mesh", "MeshLM", "MeSH", False, MeshOptions, validate=check_mesh,
              description="prelude / core x K / coda with a K+3-slot buffer and step-wise read/write routers",
              depth=check_mesh_depth),
    ModelSpec("ponderlm", "PonderLM", "PonderLM", False, PonderLMOptions,
              description="K passes of the backbone; the predicted distribution's expected embedding is fed back"),
    ModelSpec("parcae", "ParcaeLM", "Parcae", False, ParcaeOptions, validate=check_parcae,
              description="prelude / core x K / coda with the stable diagonal injection a h + Delta B e"),
    ModelSpec("pause_token", "PauseTokenLM", "Pause Token", False, PauseTokenOptions, validate=check_pause_token,
              description="K-1 pause tokens after every token; the prediction is read at the last pause",
              depth=check_pause_token_depth),
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model {name!r} (registered: {', '.join(MODELS)})")
    return MODELS[name]


# ----------------------------------------------------------------------------------------------
# Building (torch, imported here on the first build)


def build_model(cfg: ModelConfig, device: str | torch.device | None = None, init: bool = True) -> nn.Module:
    """Build (and, off the meta device, initialise) the model ``cfg.name``."""
    import torch

    from stateloop.models.init import init_weights  # torch: the registry is read without it

    spec = get_spec(cfg.name)
    spec.check(cfg)
    opts = spec.parse_options(cfg)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = spec.build(cfg, opts)
    if init and str(device) != "meta":
        init_weights(model)
    return model


def count_params(cfg: ModelConfig) -> int:
    """Parameter count, from a model built on the meta device (no weights allocated)."""
    model = build_model(cfg, device="meta")
    return sum(p.numel() for p in model.parameters())
