"""The model registry: one name -> one builder. The single spelling of every model name.

Names are lowercase ``[a-z0-9_]+`` and are used unchanged in configs, run folders, Snakemake
wildcards, MLflow run names and tables. Variant-specific knobs live in ``model.options`` and
are checked against the variant's options dataclass, so a bad key fails before anything runs.

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

import torch
import torch.nn as nn

from stateloop.config import ConfigError, from_dict
from stateloop.models.baselines.hyperloop import HyperloopLM, HyperloopOptions
from stateloop.models.baselines.hyperloop import check_options as check_hyperloop
from stateloop.models.baselines.mesh import MeshLM, MeshOptions
from stateloop.models.baselines.mesh import check_options as check_mesh
from stateloop.models.baselines.parcae import ParcaeLM, ParcaeOptions
from stateloop.models.baselines.parcae import check_options as check_parcae
from stateloop.models.baselines.pause_token import PauseTokenLM, PauseTokenOptions
from stateloop.models.baselines.pause_token import check_options as check_pause_token
from stateloop.models.baselines.ponderlm import PonderLM, PonderLMOptions
from stateloop.models.config import ModelConfig
from stateloop.models.looped import LoopedLM, StateLoopLM, StateOnlyLM


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable  # (ModelConfig, options) -> nn.Module
    label: str  # the row label the paper prints
    has_state: bool  # a persistent state of width d_s (run folders carry ds{d_s})
    options: type | None = None  # dataclass of model.options, or None (no options allowed)
    description: str = ""
    validate: Callable | None = None  # extra shape checks: (ModelConfig, options) -> None
    cls: type = LoopedLM  # the class ``build`` returns (its class methods check a config without a model)

    def parse_options(self, cfg: ModelConfig):
        if self.options is None:
            if cfg.options:
                raise ConfigError(f"model.options.{next(iter(cfg.options))}: unknown key ({self.name} takes no options)")
            return None
        return from_dict(self.options, cfg.options, "model.options")

    def check(self, cfg: ModelConfig) -> None:
        """The config's checks before a build. The state width d_s is checked here only (positive;
        state only's d_s = d in its ``validate``): the model classes and cells take it as given."""
        if self.has_state and cfg.d_state <= 0:
            raise ConfigError(f"model.d_state: {self.name} needs a positive state width d_s")
        opts = self.parse_options(cfg)
        if self.validate is not None:
            self.validate(cfg, opts)


# ----------------------------------------------------------------------------------------------
# Builders


@dataclass
class FFNOptions:
    d_ff: int | None = None  # SwiGLU width; None: matched to stateloop_mamba2 at d_s = d (5818 at 1.4B)


def matched_ffn_width(cfg: ModelConfig) -> int:
    """The SwiGLU width that gives Vanilla Looped + FFN the parameters of StateLoop + Mamba-2
    (at d_s = d): the paper's control, 5818 at 1.4B."""
    mamba = dataclasses.replace(cfg, name="stateloop_mamba2", d_state=cfg.d_model, options={})
    vanilla = dataclasses.replace(cfg, name="vanilla_looped", d_state=0, options={})
    extra = count_params(mamba) - count_params(vanilla)
    return cfg.d_ff + round(extra / (3 * cfg.d_model * cfg.n_layers))


def _vanilla_ffn(cfg, opts: FFNOptions):
    return LoopedLM(cfg, d_ff=opts.d_ff if opts.d_ff is not None else matched_ffn_width(cfg))


def _state_only_check(cfg, _opts):
    if cfg.d_state != cfg.d_model:
        raise ConfigError(f"model.d_state: state_only keeps the state at the model width d={cfg.d_model}, got {cfg.d_state}")


_SPECS = [
    ModelSpec("vanilla_looped", lambda cfg, _: LoopedLM(cfg), "Vanilla Looped", False,
              description="one shared backbone applied K times"),
    ModelSpec("vanilla_looped_ffn", _vanilla_ffn, "Vanilla Looped + FFN", False, FFNOptions,
              description="Vanilla Looped with a wider SwiGLU, parameter-matched to StateLoop + Mamba-2"),
    ModelSpec("stateloop", lambda cfg, _: StateLoopLM(cfg), "StateLoop", True,
              description="persistent state, selective-SSM update, identity mixer (eqs. 1-7, 10-12)", cls=StateLoopLM),
    ModelSpec("stateloop_attn", lambda cfg, _: StateLoopLM(cfg, mixer="attn"), "StateLoop + Attention", True,
              description="StateLoop with causal attention over the state (eq. 8)", cls=StateLoopLM),
    ModelSpec("stateloop_mamba2", lambda cfg, _: StateLoopLM(cfg, mixer="mamba2"), "StateLoop + Mamba-2", True,
              description="StateLoop with a Mamba-2 block over the state (eq. 9)", cls=StateLoopLM),
    ModelSpec("state_only", lambda cfg, _: StateOnlyLM(cfg), "State only", True,
              description="the gated state alone is the next backbone input; no state reads (eq. 13)",
              validate=_state_only_check, cls=StateOnlyLM),
    ModelSpec("reset_state", lambda cfg, _: StateLoopLM(cfg, reset=True), "Reset state", True,
              description="the state is reset before every update (eq. 14)", cls=StateLoopLM),
    ModelSpec("stateloop_gru", lambda cfg, _: StateLoopLM(cfg, update="gru"), "GRU update", True,
              description="a GRU cell replaces the selective-SSM update (eq. 6)", cls=StateLoopLM),
    # The paper's baselines (models/baselines/, docs/baselines.md).
    ModelSpec("hyperloop", lambda cfg, o: HyperloopLM(cfg, o), "Hyperloop", False,
              HyperloopOptions, validate=check_hyperloop,
              description="begin / middle x K / end blocks, n residual streams with loop-level hyper-connections", cls=HyperloopLM),
    ModelSpec("mesh", lambda cfg, o: MeshLM(cfg, o), "MeSH", False, MeshOptions,
              validate=check_mesh,
              description="prelude / core x K / coda with a K+3-slot buffer and step-wise read/write routers", cls=MeshLM),
    ModelSpec("ponderlm", lambda cfg, o: PonderLM(cfg, o), "PonderLM", False, PonderLMOptions,
              description="K passes of the backbone; the predicted distribution's expected embedding is fed back", cls=PonderLM),
    ModelSpec("parcae", lambda cfg, o: ParcaeLM(cfg, o), "Parcae", False, ParcaeOptions,
              validate=check_parcae,
              description="prelude / core x K / coda with the stable diagonal injection a h + Delta B e", cls=ParcaeLM),
    ModelSpec("pause_token", lambda cfg, o: PauseTokenLM(cfg, o), "Pause Token", False,
              PauseTokenOptions, validate=check_pause_token,
              description="K-1 pause tokens after every token; the prediction is read at the last pause", cls=PauseTokenLM),
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"model.name: unknown model {name!r} (registered: {', '.join(MODELS)})")
    return MODELS[name]


def build_model(cfg: ModelConfig, device: str | torch.device | None = None, init: bool = True) -> nn.Module:
    """Build (and, off the meta device, initialise) the model ``cfg.name``."""
    from stateloop.models.init import init_weights

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

