"""Resolve and check one run's config before anything trains.

Resolution order (docs/architecture.md#how-a-runs-config-resolves): the scale's sections -> the experiment's model options (an
experiment of the config must define the run: an unknown id is refused) -> the run id's model, K, d_s and seed (the seed
replaces ``train.seed``) -> ``key=value``
overrides (``train.lr=1e-3``, ``model.norm_eps=1e-6``, ``data.dir=...``; overriding one of
``train.max_steps`` / ``train.max_tokens`` replaces the scale's budget given by the other). The result is the
resolved config written to ``RUN_DIR/config.yaml`` and saved inside the final weights::

    run:   {id, scale, model, K, d_s, seed, config, experiments}
    model: ModelConfig fields
    train: TrainConfig fields
    data:  {dir: absolute path of the token shards}

Every failure is a one-line :class:`ConfigError` (or ``FileNotFoundError``) naming the key or file.
"""

from __future__ import annotations

from pathlib import Path

from stateloop.config import ConfigError, from_dict, merge, parse_dotlist, to_dict
from stateloop.models.config import ModelConfig
from stateloop.runs import RUN_ID, RUN_ID_EXAMPLE, RUN_ID_FORM
from stateloop.train.config import TrainConfig

SECTIONS = ("model", "train", "data")
FIXED_BY_RUN_ID = ("name", "K", "d_state")  # model keys the run id sets


def parse_run_id(run_id: str) -> tuple[str, str, int, int, int]:
    """(scale, model, K, d_s, seed) of a run id."""
    m = RUN_ID.fullmatch(run_id)
    if not m:
        raise ConfigError(f"RUN: expected {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}), got {run_id!r}")
    return m["scale"], m["model"], int(m["K"]), int(m["ds"]), int(m["seed"])


def resolve_run(config_path: str | Path, run_id: str, overrides: list[str] | None = None,
                data_dir: str | Path | None = None) -> dict:
    """The resolved config dict of run ``run_id`` of the pipeline config ``config_path``."""
    from stateloop.pipeline import expand_runs, load_pipeline, run_model_config

    pipeline = load_pipeline(config_path)
    scale_name, model_name, K, d_s, seed = parse_run_id(run_id)
    if scale_name not in pipeline.scales:
        raise ConfigError(f"RUN: unknown scale {scale_name!r} in {config_path} (defined: {', '.join(pipeline.scales)})")
    scale = pipeline.scales[scale_name]
    known = {r.id: r for r in expand_runs(pipeline)}
    if run_id not in known:  # a typo must not start a training nobody planned
        d_state = run_model_config(scale, model_name, K, d_s).d_state  # an unknown model: one line
        if d_state != d_s:
            raise ConfigError(f"RUN: {model_name} has no persistent state, so its run id is "
                              f"{scale_name}/{model_name}/K{K}_ds{d_state}_seed{seed}")
        near = [r for r in known if r.startswith(f"{scale_name}/{model_name}/")] or [r for r in known if r.startswith(f"{scale_name}/")]
        listed = ", ".join(near[:6]) + (f", ... ({len(near)} in all)" if len(near) > 6 else "")
        raise ConfigError(f"RUN: {run_id} is not a run of {config_path}; add it to an experiment there "
                          f"(its runs like it: {listed or 'none'})")
    run = known[run_id]
    mcfg, experiments = run.model_config, list(run.experiments)

    extra = parse_dotlist(overrides or [])
    for section in extra:
        if section not in SECTIONS:
            raise ConfigError(f"{section}: unknown section in override (allowed: {', '.join(SECTIONS)})")
        if not isinstance(extra[section], dict):
            raise ConfigError(f"{section}: override must name a key inside the section, e.g. {section}.key=value")
    for key in FIXED_BY_RUN_ID:
        if key in extra.get("model", {}):
            raise ConfigError(f"model.{key}: set by the run id {run_id}, not by an override")
    if "seed" in extra.get("train", {}):
        raise ConfigError(f"train.seed: set by the run id {run_id} (its _seed suffix), not by an override")

    from stateloop.models.registry import get_spec

    model_dict = merge(to_dict(mcfg), extra.get("model", {}))
    mcfg = from_dict(ModelConfig, model_dict, "model")
    get_spec(mcfg.name).check(mcfg)
    train_extra = dict(extra.get("train", {}))
    # The budget is one of two keys: overriding one replaces the scale's other.
    for key, other in (("max_steps", "max_tokens"), ("max_tokens", "max_steps")):
        if key in train_extra and other not in train_extra:
            train_extra[other] = 0
    tcfg = from_dict(TrainConfig, merge(to_dict(scale.train), {**train_extra, "seed": seed}), "train")
    tcfg.check_budget()
    if tcfg.seq_len > mcfg.max_seq_len:
        raise ConfigError(f"train.seq_len: {tcfg.seq_len} exceeds model.max_seq_len = {mcfg.max_seq_len}")

    data_extra = dict(extra.get("data", {}))
    unknown = set(data_extra) - {"dir"}
    if unknown:
        raise ConfigError(f"data.{sorted(unknown)[0]}: unknown key (allowed: dir)")
    folder = data_dir or data_extra.get("dir")
    if not folder:
        raise ConfigError("--data-dir: no token-shard folder given (pass --data-dir DIR or data.dir=DIR)")
    return {
        "run": {"id": run_id, "scale": scale_name, "model": model_name, "K": K, "d_s": mcfg.d_state, "seed": seed,
                "config": str(config_path), "experiments": experiments},
        "model": to_dict(mcfg),
        "train": to_dict(tcfg),
        "data": {"dir": str(Path(folder).resolve())},
    }


def parse_resolved(config: dict) -> tuple[ModelConfig, TrainConfig]:
    """The typed sections of a resolved config (as written to config.yaml)."""
    for section in ("run", "model", "train", "data"):
        if section not in config:
            raise ConfigError(f"{section}: missing section in the resolved config")
    return from_dict(ModelConfig, config["model"], "model"), from_dict(TrainConfig, config["train"], "train")


def open_data(config: dict, mcfg: ModelConfig, tcfg: TrainConfig):
    """Open and check the token shards a resolved config names (its model and train sections
    already parsed): (train ShardSet, val ShardSet or None).

    Fails, naming the folder or file, when the folder or its meta.json is missing, a split is
    missing or shorter than one window, a shard's size disagrees with meta.json, or the
    tokenizer's vocabulary does not fit ``model.vocab_size``.
    """
    from stateloop.data.shards import META, ShardSet, read_meta

    folder = Path(config["data"]["dir"])
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: data folder not found (run `stateloop tokenize` first)")
    meta = read_meta(folder)  # FileNotFoundError naming meta.json
    where = folder / META
    try:
        vocab = int(meta["vocab_size"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: no integer vocab_size") from None
    if vocab > mcfg.vocab_size:
        raise ConfigError(f"{where}: the tokenizer's vocabulary ({vocab} ids) does not fit model.vocab_size = {mcfg.vocab_size}")

    def split(name: str):
        try:
            shards = ShardSet(folder, name)
        except KeyError as err:
            raise ConfigError(str(err).strip("'\"")) from None
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if len(shards) < tcfg.seq_len + 1:
            raise ConfigError(f"{where}: split {name!r} has {len(shards)} tokens, fewer than one window of "
                              f"train.seq_len + 1 = {tcfg.seq_len + 1}")
        return shards

    train = split("train")
    val = split(tcfg.val_split) if tcfg.val_tokens > 0 else None
    return train, val

