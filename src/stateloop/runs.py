"""Run folders: what training leaves behind, and what evaluation and analyses read.

    results/runs/{scale}/{model}/K{K}_ds{ds}_seed{seed}/
        config.yaml        the resolved run config (sections: run, model, data, train, ...)
        model.safetensors  final weights; the resolved config (JSON) and code version in its metadata
                           (read_weights: no unpickler)
        checkpoints/       resumable training state (train stage)
        train.json         training summary (steps, tokens, losses, the validation curve and its windows, MLflow run id, code version)
        train.log          what every attempt of the DAG's train job printed (the rule appends)
        mlflow.json        the MLflow store, experiment and run the training logged to
        .lock              held by the training that writes the folder (flock)
        eval.json, eval_depth.json, shapley.json, interventions.json, ...   results of later stages

A run folder alone rebuilds its model (from the saved config, never from command-line arguments);
a command's RUN is a run folder or a run id, as :func:`resolve_run_arg` decides.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from stateloop.config import ConfigError, from_dict
from stateloop.config.model import ModelConfig
from stateloop.config.run import RunConfig
from stateloop.files import code_version, read_safetensors, write_safetensors
from stateloop.models.registry import build_model
from stateloop.run_ids import RUN_ID_EXAMPLE, RUN_ID_FORM, RUNS_ROOT, parse_run_id

if TYPE_CHECKING:  # torch is imported where it is used
    import torch

FINAL_WEIGHTS = "model.safetensors"
CONFIG_METADATA = "stateloop_config"  # the safetensors metadata key of the resolved config (a JSON string)
RUN_CONFIG = "config.yaml"
TRAIN_SUMMARY = "train.json"
MLFLOW_FILE = "mlflow.json"
DEPTH_FILE = "eval_depth.json"  # a run's held-out PPL at its test-time depths (`stateloop eval RUN --depths ...`)
BENCH_FILE = "bench/decode.json"  # Table 3's timings (`stateloop bench decode`), under the results folder


def weights_metadata(config: dict) -> dict[str, str]:
    """The metadata of a final weights file: the resolved config (JSON) and the code version."""
    return {"format": "pt", CONFIG_METADATA: json.dumps(config, sort_keys=True, default=str), "code_version": code_version()}


def save_final(run_dir: str | Path, model: torch.nn.Module | dict, config: dict) -> Path:
    """Save the final weights (a model or its state dict) with the resolved config, atomically, as
    ``model.safetensors``."""
    path = Path(run_dir) / FINAL_WEIGHTS
    write_safetensors(path, model if isinstance(model, dict) else model.state_dict(), weights_metadata(config))
    return path


def read_weights(run_dir: str | Path, tensors: bool = True) -> tuple[Path, dict]:
    """(path, {"model": state_dict, "config": resolved config}) of a run's ``model.safetensors``,
    the config from its metadata, read with no unpickler. ``tensors=False``: the config only
    ("model" is None; no tensor is read)."""
    path = Path(run_dir) / FINAL_WEIGHTS
    if not path.is_file():
        where = "has the run finished training?" if Path(run_dir).is_dir() else "no such run folder"
        raise FileNotFoundError(f"{path}: no final weights ({where})")
    state, metadata = read_safetensors(path, tensors)
    try:
        config = json.loads(metadata[CONFIG_METADATA])
    except (KeyError, ValueError):
        config = None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a stateloop weights file (no {CONFIG_METADATA} JSON in its metadata)")
    return path, {"model": state, "config": config}


def has_final_weights(run_dir: str | Path) -> bool:
    return (Path(run_dir) / FINAL_WEIGHTS).is_file()


def saved_config(run_dir: str | Path) -> dict:
    """The resolved config saved with a run's weights (no weights are read)."""
    return read_weights(run_dir, tensors=False)[1]["config"]


def load_model(run_dir: str | Path, device: str | torch.device = "cpu"):
    """Rebuild a run's model from its folder. Returns (model in eval mode, resolved config dict).

    Fails with a one-line error naming the file when the folder has no final weights, the file is
    unreadable, or the weights do not fit the saved config.
    """
    path, blob = read_weights(run_dir)
    config = blob["config"]
    mcfg = from_dict(ModelConfig, config.get("model"), "model")
    model = build_model(mcfg, init=False)
    try:
        model.load_state_dict(blob["model"], strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise ConfigError(f"{path}: weights do not match the saved config ({first})") from None
    check_folder_config(Path(run_dir), mcfg, path)
    return model.to(device).eval(), config


def check_folder_config(run_dir: Path, saved: ModelConfig, weights_path: Path) -> None:
    """A run folder's config.yaml, when present, must describe the model the weights were saved with
    (a folder whose config was edited after training fails here, naming the first differing key)."""
    import yaml

    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return
    try:
        folder = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(folder, dict) or "model" not in folder:
        return
    try:
        ours = from_dict(ModelConfig, folder["model"], "model")
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    if ours != saved:
        key = next(k for k in vars(saved) if getattr(saved, k) != getattr(ours, k))
        raise ConfigError(f"{path}: model.{key} = {getattr(ours, key)!r} does not match the weights' config "
                          f"({getattr(saved, key)!r} in {weights_path})")


class RunArg(NamedTuple):
    """What a command line's RUN names: its folder and, when known, its run id."""
    folder: Path
    id: str | None  # the id given, or the folder's when it is <...>/runs/<run id>; None otherwise


def _folder_run_id(folder: Path) -> str | None:
    """The run id of a folder laid out as ``<...>/runs/{scale}/{model}/K{K}_ds{ds}_seed{seed}``
    (spelled so, or so once symlinks are resolved), else None."""
    for path in (Path(os.path.abspath(folder)), folder.resolve()):
        if len(path.parts) > 4 and path.parts[-4] == "runs" and parse_run_id("/".join(path.parts[-3:])):
            return "/".join(path.parts[-3:])
    return None


def resolve_run_arg(arg: str, name: str = "RUN") -> RunArg:
    """The run a command-line RUN argument (named ``name`` in errors) addresses: an existing
    directory is the run folder itself; otherwise a run id ``{scale}/{model}/K{K}_ds{ds}_seed{seed}``
    names ``results/runs/<id>`` (which need not exist: the command reading it says so, in one
    line); anything else is a one-line ConfigError naming the argument and the two forms. A RUN
    spelled as a run id whose scale is ``.`` or ``..`` (no config has one: pipeline.check_pipeline)
    is refused whether or not a folder of that path exists: as an id it would name a folder outside
    ``results/runs``, and which of the two it meant only the user knows; a folder is then given by
    its full path."""
    parts = parse_run_id(arg)
    if parts and parts[0] in (".", ".."):
        raise ConfigError(f"{name}: {arg!r}: {parts[0]!r} is not a scale (a run id names a folder inside {RUNS_ROOT}); "
                          f"give a run folder elsewhere by its full path, e.g. {os.path.abspath(arg)}")
    if arg and Path(arg).is_dir():
        return RunArg(Path(arg), _folder_run_id(Path(arg)))
    if parts:
        return RunArg(Path(RUNS_ROOT) / arg, arg)
    raise ConfigError(f"{name}: expected a run folder or a run id {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}, for "
                      f"{RUNS_ROOT}/<id>), got {arg!r} (no such run folder: no final weights)")


def saved_run_config(run_dir: str | Path, config: dict | None = None) -> RunConfig:
    """The resolved config saved with a run's weights, typed: ``pipeline.RunConfig.read`` of a
    finished run's config (``saved``; a bad key is one line naming the weights file). ``config``:
    the mapping already read (load_model's second value), else it is read here (no tensors)."""
    return RunConfig.read(saved_config(run_dir) if config is None else config, str(Path(run_dir) / FINAL_WEIGHTS),
                          saved=True)


def run_id_of(run_dir: str | Path, config: RunConfig) -> str:
    """The run id ``{scale}/{model}/K{K}_ds{ds}_seed{seed}``: the resolved config's ``run.id`` when it names
    one, else the folder's last three components (results/runs/<id>)."""
    if not config.run.id:
        return "/".join(Path(run_dir).resolve().parts[-3:])
    if not parse_run_id(config.run.id):  # it names MLflow runs and goes into searches
        raise ConfigError(f"{Path(run_dir) / FINAL_WEIGHTS}: run.id: expected a run id {RUN_ID_FORM}, got {config.run.id!r}")
    return config.run.id


def trained_length(config: RunConfig) -> int | None:
    """The context a run was trained with (``train.seq_len`` of its resolved config), or None
    where the saved config has no train section. Never above ``model.max_seq_len``: training
    refuses a longer seq_len (resolve.resolve_run), so only a saved train section that lacks the
    key (its default, 2048, then stands in) could say more than the model reads."""
    return min(config.train.seq_len, config.model.max_seq_len) if config.train is not None else None


def resolve_device(name: str = "auto"):
    """``auto``: CUDA when available, else the CPU; otherwise the named device, which must exist
    here (a one-line ConfigError names it otherwise)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device {name!r}: not a device name (auto, cpu, cuda, cuda:N, ...)") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
        raise ConfigError(f"device {name}: this machine has {have}; use --device cpu or auto")
    return device
