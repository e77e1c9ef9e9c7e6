"""The model registry: one name -> one builder. The single spelling of every model name.

Names are lowercase ``[a-z0-9_]+`` and are used unchanged in configs, run folders, Snakemake
wildcards, MLflow run names and tables. Variant-specific knobs live in ``model.options`` and
are checked against the variant's options dataclass, so a bad key fails before anything runs.

The registry holds everything a config check reads about a model: its name, label, whether it
has a state, its options dataclass and their checks, and the test-time depths it refuses. It
imports no torch, so the Snakefile, ``stateloop plan`` and every config check read it without
loading torch and the model modules: a spec names its model class, imported when a model
is built (:func:`build_model`; it, :func:`count_params` and :func:`matched_ffn_width` need torch).

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
from stateloop.models.config import ModelConfig

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
    depth: Callable | None = None  # (trained ModelConfig, K) -> None, refusing a K; None: every K
    state_at_d_model: bool = False  # the state is the backbone's input, so d_s must be d (state only)
    variant: dict = dataclasses.field(default_factory=dict)  # the model class's keyword arguments

    def build(self, cfg: ModelConfig, opts):
        cls = model_classes()[self.model]
        if self.options is FFNOptions:
            return cls(cfg, d_ff=opts.d_ff if opts.d_ff is not None else matched_ffn_width(cfg))
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
        ``test_time_K`` before any model is built (pipeline.check_depths). Without ``depth``,
        every K: the loop shares one weight set across iterations."""
        if self.depth is not None:
            self.depth(trained, K)


# ----------------------------------------------------------------------------------------------
# Options and their checks (the model classes read them too; nothing here needs torch)


@dataclass
class FFNOptions:
    d_ff: int | None = None  # SwiGLU width; None: matched to stateloop_mamba2 at d_s = d (5818 at 1.4B)


def resolve_split(cfg, opts, names: tuple[str, ...], parts: tuple[int, ...], model: str) -> tuple[int, ...]:
    """Layer counts of a unique/shared/unique split.

    An option left at None takes its share ``part / sum(parts)`` of ``cfg.n_layers`` (8/8/8 or
    6/12/6 at the paper's 24 layers). Explicit counts are used as given: the model then has
    their sum as unique layers and ``cfg.n_layers`` plays no role (the tiny test shapes use 1/1/1).
    """
    total = sum(parts)
    out = []
    for name, part in zip(names, parts):
        value = getattr(opts, name)
        if value is None:
            if (cfg.n_layers * part) % total:
                raise ConfigError(
                    f"model.options.{name}: {model} cannot split n_layers={cfg.n_layers} as "
                    f"{'/'.join(map(str, parts))}; set {', '.join(names)} explicitly"
                )
            value = cfg.n_layers * part // total
        out.append(value)
    return tuple(out)


def check_split(counts: dict[str, int], looped: str, model: str) -> None:
    for name, value in counts.items():
        if value < 0 or (name == looped and value < 1):
            bound = "at least 1" if name == looped else "non-negative"
            raise ConfigError(f"model.options.{name}: {model} needs {bound} layers, got {value}")


PRELUDE_CORE_CODA = ("n_prelude", "n_core", "n_coda")


def check_prelude_core_coda(cfg, opts, model: str) -> None:
    check_split(dict(zip(PRELUDE_CORE_CODA, resolve_split(cfg, opts, PRELUDE_CORE_CODA, (1, 1, 1), model))), "n_core", model)


HYPERLOOP_SPLIT = ("n_begin", "n_middle", "n_end")
HYPERLOOP_SHARES = (1, 2, 1)


@dataclass
class HyperloopOptions:
    n_begin: int | None = None  # unique begin layers; None: n_layers / 4 (6 at 24)
    n_middle: int | None = None  # shared middle layers, looped K times; None: n_layers / 2 (12)
    n_end: int | None = None  # unique end layers; None: n_layers / 4 (6)
    n_streams: int = 4  # n parallel residual streams
    alpha_init: float = 0.01  # alpha^{pre,post,res} at init (mHC's value)
    res_bias: float = 3.0  # b_res at init: h_res = sigmoid(3) ~ 0.95


def check_hyperloop(cfg, opts: HyperloopOptions) -> None:
    counts = resolve_split(cfg, opts, HYPERLOOP_SPLIT, HYPERLOOP_SHARES, "hyperloop")
    check_split(dict(zip(HYPERLOOP_SPLIT, counts)), "n_middle", "hyperloop")
    if opts.n_streams < 1:
        raise ConfigError(f"model.options.n_streams: must be positive, got {opts.n_streams}")


def check_hyperloop_depth(trained, K: int) -> None:
    """[choice] Test-time depth: loop l has its own hyper-connection and loop embedding e_l,
    so the model runs at any K' up to the trained K (the first K' of them); past it there are
    none for the extra loops."""
    if K > trained.K:
        raise ConfigError(f"eval.K: hyperloop has no meaning at K={K}: each loop has its own hyper-connection "
                          f"and it was trained with {trained.K} (K <= {trained.K} only)")


@dataclass
class MeshOptions:
    n_prelude: int | None = None  # unique layers before the loop; None: n_layers / 3 (8 at 24)
    n_core: int | None = None  # shared core layers, repeated K times; None: n_layers / 3
    n_coda: int | None = None  # unique layers after the loop; None: n_layers / 3
    n_slots: int | None = None  # buffer slots S; None: K + 3 (the paper's rule, 13 at K = 10)
    protect_embedding_slot: bool = False  # true: slot 0 keeps the embedding (writes go to slots 1..S-1)


def resolve_slots(cfg, opts: MeshOptions) -> int:
    return cfg.K + 3 if opts.n_slots is None else opts.n_slots


def check_mesh(cfg, opts: MeshOptions) -> None:
    check_prelude_core_coda(cfg, opts, "mesh")
    if resolve_slots(cfg, opts) < 2:
        raise ConfigError(f"model.options.n_slots: mesh needs at least 2 slots, got {resolve_slots(cfg, opts)}")


def check_mesh_depth(trained, K: int) -> None:
    """[choice] Test-time depth: core step t uses router pair t + 1, so the model runs at any
    K' up to the trained K (the first K' + 1 router pairs, the trained buffer of S slots); past
    it there is no router for the extra steps."""
    if K > trained.K:
        raise ConfigError(f"eval.K: mesh has no meaning at K={K}: its routers are per step and it was trained "
                          f"with {trained.K + 1} router pairs (K <= {trained.K} only)")


@dataclass
class PonderLMOptions:
    scale_embeds: bool = True  # c = sqrt(d) on the input and pondering embeddings (else c = 1)
    multiply_pondering_steps: bool = True  # z^0 = s c E[x] (official 1.4B recipe)


@dataclass
class ParcaeOptions:
    n_prelude: int | None = None  # unique layers before the loop; None: n_layers / 3 (8 at 24)
    n_core: int | None = None  # shared core layers, repeated K times; None: n_layers / 3
    n_coda: int | None = None  # unique layers after the loop; None: n_layers / 3
    state_init: str = "random"  # h_0: "random" (official like-init) or "zero"
    eval_seed: int = 0  # seed of the fixed per-position h_0 in eval mode

    def __post_init__(self) -> None:
        if self.state_init not in ("random", "zero"):
            raise ConfigError(f"options.state_init: must be random or zero, got {self.state_init!r}")


def check_parcae(cfg, opts: ParcaeOptions) -> None:
    check_prelude_core_coda(cfg, opts, "parcae")


@dataclass
class PauseTokenOptions:
    n_pause: int | None = None  # pauses after every real token; None: K - 1 (3 at K = 4)
    pause_id: int | None = None  # embedding row of <pause>; None: vocab_size - 1 (an unused padded id)


def resolve_pause(cfg, opts: PauseTokenOptions) -> tuple[int, int]:
    n_pause = cfg.K - 1 if opts.n_pause is None else opts.n_pause
    pause_id = cfg.vocab_size - 1 if opts.pause_id is None else opts.pause_id
    return n_pause, pause_id


def check_pause_token(cfg, opts: PauseTokenOptions) -> None:
    n_pause, pause_id = resolve_pause(cfg, opts)
    if n_pause < 0:
        raise ConfigError(f"model.options.n_pause: must be >= 0, got {n_pause}")
    if not 0 <= pause_id < cfg.vocab_size:
        raise ConfigError(f"model.options.pause_id: must be a row of the vocabulary [0, {cfg.vocab_size}), got {pause_id}")


def check_pause_token_depth(trained, K: int) -> None:
    """Test-time depth: K' - 1 pauses after every token (the pause count is the model's depth),
    unless ``n_pause`` fixes the count, which K then does not set."""
    n_pause = (trained.options or {}).get("n_pause")
    if n_pause is not None:
        raise ConfigError(f"eval.K: pause_token has no depth K to change: model.options.n_pause = {n_pause} "
                          f"fixes its pauses")


def model_classes() -> dict[str, type]:
    """The model classes by name, imported on a build: they need torch, which a config check does not
    load, and their modules import this registry's options (import statements, not names in strings:
    the Hugging Face export bundles the modules these lines import, export/hf.py)."""
    from stateloop.models.baselines.hyperloop import HyperloopLM  # torch; cycle: it imports the options here
    from stateloop.models.baselines.mesh import MeshLM  # torch; cycle
    from stateloop.models.baselines.parcae import ParcaeLM  # torch; cycle
    from stateloop.models.baselines.pause_token import PauseTokenLM  # torch; cycle
    from stateloop.models.baselines.ponderlm import PonderLM  # torch; cycle
    from stateloop.models.looped import LoopedLM, StateLoopLM, StateOnlyLM  # torch; cycle

    return {c.__name__: c for c in (LoopedLM, StateLoopLM, StateOnlyLM, HyperloopLM, MeshLM, ParcaeLM, PauseTokenLM,
                                    PonderLM)}


_SPECS = [
    ModelSpec("vanilla_looped", "LoopedLM", "Vanilla Looped", False,
              description="one shared backbone applied K times"),
    ModelSpec("vanilla_looped_ffn", "LoopedLM", "Vanilla Looped + FFN", False, FFNOptions,
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


def matched_ffn_width(cfg: ModelConfig) -> int:
    """The SwiGLU width that gives Vanilla Looped + FFN the parameters of StateLoop + Mamba-2
    (at d_s = d): the paper's control, 5818 at 1.4B."""
    mamba = dataclasses.replace(cfg, name="stateloop_mamba2", d_s=cfg.d_model, options={})
    vanilla = dataclasses.replace(cfg, name="vanilla_looped", d_s=0, options={})
    extra = count_params(mamba) - count_params(vanilla)
    return cfg.d_ff + round(extra / (3 * cfg.d_model * cfg.n_layers))
