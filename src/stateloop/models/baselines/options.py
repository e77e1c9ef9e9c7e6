"""The baselines' options (``model.options``) and their config checks, beside the baselines
(models/baselines/): what a config check reads about them, so it imports no torch. The model
classes and the registry (models/registry.py) read these; nothing here knows the registry."""

from __future__ import annotations

from pydantic import Field

from stateloop.config import Bool, ConfigError, Float, Int, Text, section


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


@section
class HyperloopOptions:
    n_begin: Int | None = Field(None, description="unique begin layers; None: n_layers / 4 (6 at 24)")
    n_middle: Int | None = Field(None, description="shared middle layers, looped K times; None: n_layers / 2 (12)")
    n_end: Int | None = Field(None, description="unique end layers; None: n_layers / 4 (6)")
    n_streams: Int = Field(4, description="n parallel residual streams")
    alpha_init: Float = Field(0.01, description="alpha^{pre,post,res} at init (mHC's value)")
    res_bias: Float = Field(3.0, description="b_res at init: h_res = sigmoid(3) ~ 0.95")


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


@section
class MeshOptions:
    n_prelude: Int | None = Field(None, description="unique layers before the loop; None: n_layers / 3 (8 at 24)")
    n_core: Int | None = Field(None, description="shared core layers, repeated K times; None: n_layers / 3")
    n_coda: Int | None = Field(None, description="unique layers after the loop; None: n_layers / 3")
    n_slots: Int | None = Field(None, description="buffer slots S; None: K + 3 (the paper's rule, 13 at K = 10)")
    protect_embedding_slot: Bool = Field(False, description="true: slot 0 keeps the embedding (writes go to slots 1..S-1)")


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


@section
class PonderLMOptions:
    scale_embeds: Bool = Field(True, description="c = sqrt(d) on the input and pondering embeddings (else c = 1)")
    multiply_pondering_steps: Bool = Field(True, description="z^0 = s c E[x] (official 1.4B recipe)")


@section
class ParcaeOptions:
    n_prelude: Int | None = Field(None, description="unique layers before the loop; None: n_layers / 3 (8 at 24)")
    n_core: Int | None = Field(None, description="shared core layers, repeated K times; None: n_layers / 3")
    n_coda: Int | None = Field(None, description="unique layers after the loop; None: n_layers / 3")
    state_init: Text = Field("random", description="h_0: \"random\" (official like-init) or \"zero\"")
    eval_seed: Int = Field(0, description="seed of the fixed per-position h_0 in eval mode")

    def __post_init__(self) -> None:
        if self.state_init not in ("random", "zero"):
            raise ConfigError(f"options.state_init: must be random or zero, got {self.state_init!r}")


def check_parcae(cfg, opts: ParcaeOptions) -> None:
    check_prelude_core_coda(cfg, opts, "parcae")


@section
class PauseTokenOptions:
    n_pause: Int | None = Field(None, description="pauses after every real token; None: K - 1 (3 at K = 4)")
    pause_id: Int | None = Field(None, description="embedding row of <pause>; None: vocab_size - 1 (an unused padded id)")


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
