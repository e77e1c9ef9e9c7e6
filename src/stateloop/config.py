"""Configuration schema: dataclasses are the schema, YAML files hold values only.

Every section of a config file is read into a dataclass by :func:`from_dict`, which rejects
unknown keys and values of the wrong type with a one-line :class:`ConfigError` naming the key
(``model.d_modle: unknown key``). The sections' dataclasses live with their stages:
``models/config.py`` (ModelConfig), ``sections/data.py``, ``sections/train.py``, ``sections/evaluate.py``;
how a run's config resolves: ``resolve.resolve_run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type. The message names the key."""


# ----------------------------------------------------------------------------------------------
# Strict dict -> dataclass conversion


_YAML11_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert nested dataclasses."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of {tp}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        (item_tp, *_rest) = typing.get_args(tp) or (Any,)
        return [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        key_tp, val_tp = typing.get_args(tp) or (Any, Any)
        return {_convert(k, key_tp, f"{where}"): _convert(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if tp is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return list(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.match(value):  # PyYAML reads 3e-4 (no dot) as a string
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):  # .nan / .inf would pass every "<= 0" check
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            # YAML reads 1.4b as a string but 410 as an int; names are strings.
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return str(value)
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported annotation {_type_name(tp)}")


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or cls.__name__}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            raise ConfigError(f"{path}: unknown key (allowed: {', '.join(sorted(names))})")
        kwargs[key] = _convert(value, hints[key], path)
    for f in dataclasses.fields(cls):
        if f.init and f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where + '.' if where else ''}{f.name}: missing required key")
    try:
        return cls(**kwargs)
    except ConfigError as err:
        msg = str(err)
        # Field checks in __post_init__ name the key relative to the section; prefix the section path.
        raise ConfigError(msg if not where or msg.startswith(where) else f"{where}.{msg.split('.', 1)[-1]}") from None


KEEP: Any = type("Keep", (), {"__repr__": lambda self: "KEEP"})()  # a request field's default: as the config has it
# (where None is a value of its own: unset)


def arg(help: str, default: Any = dataclasses.MISSING, **flag: Any) -> Any:
    """A request field declared with its command's flag (commands.add_flags builds the flag from
    it): ``help`` its help text; without ``default`` the flag is required; ``flag``: argparse's
    metavar, choices, nargs or type (a converter of the text), and positional=True, name (the
    flag when it is not the field's name, "--set"), only (the one subcommand that has it), check
    ((predicate, "what it asks") of a value given: :data:`POSITIVE`)."""
    meta = {"help": help, **flag}
    if isinstance(default, list):
        return dataclasses.field(default_factory=default.copy, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


POSITIVE = (lambda v: v > 0, "positive")


def whole(what: str) -> Any:
    """A flag's converter: a whole number of ``what`` >= 1, else argparse's one-line error."""
    def convert(text: str) -> int:
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"must be a whole number of {what} >= 1, got {text}")
        return int(text)
    return convert


def flag_of(f: dataclasses.Field) -> str:
    """A request field's flag: ``data_dir`` -> ``--data-dir``, its own name (metadata ``name``), or a
    positional's metavar."""
    if f.metadata.get("positional"):
        return f.metadata.get("metavar", f.name.upper())
    return f.metadata.get("name", "--" + f.name.replace("_", "-"))


def kinds_of(tp: Any) -> tuple:
    """The members of a union annotation (``int | None``: int, NoneType), else the annotation alone."""
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def _from_text(value: Any, tp: Any, flag: str) -> Any:
    """A flag's text as its field's annotation asks: a number for int or float, and for a field that
    may be None, "none"/"null" (any case) is None; a list item by item; other values as they are."""
    kinds = kinds_of(tp)
    if isinstance(value, list):
        items = [typing.get_args(k)[0] for k in kinds if typing.get_origin(k) is list] or [Any]
        return [_from_text(v, items[0], flag) for v in value]
    if not isinstance(value, str):
        return value
    if value.lower() in ("none", "null") and type(None) in kinds:
        return None
    for number, expected in ((int, "an integer"), (float, "a number")):
        if number in kinds:
            try:
                return number(value)
            except ValueError:
                raise ConfigError(f"{flag}: expected {expected}, got {value!r}") from None
    return value


class StageRequest:
    """The base of a command's request (a frozen dataclass): its fields, declared with :func:`arg`,
    are the command's flags (commands.add_flags), and a stage's function takes it, so a stage is a
    Python API as well as a command. Values are checked as :func:`from_dict` checks a config
    section, on construction from Python as from flags; a field at :data:`KEEP` is not checked."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True)(cls)

    @classmethod
    def where(cls) -> str:
        """The request's name in messages: its module below the package, and the class."""
        return f"{cls.__module__.removeprefix('stateloop.')}.{cls.__name__}"

    @classmethod
    def of(cls, args) -> Any:
        """The request of a command's parsed flags (an argparse namespace): each field from the
        attribute of the same name, its text read as the field's type (a bad number, or one its
        check refuses, is a one-line ConfigError naming the flag); a field the namespace lacks (a flag not given) keeps its
        default, a required one is a one-line ConfigError; attributes that are no field (the
        command's name) are left out."""
        hints, given = typing.get_type_hints(cls), vars(args)
        values = {f.name: _from_text(given[f.name], hints[f.name], flag_of(f))
                  for f in dataclasses.fields(cls) if f.init and f.name in given}
        for f in dataclasses.fields(cls):
            if (check := f.metadata.get("check")) and values.get(f.name) is not None and not check[0](values[f.name]):
                raise ConfigError(f"{flag_of(f)} must be {check[1]}, got {values[f.name]}")
        return from_dict(cls, values, cls.where())

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            if f.init and getattr(self, f.name) is not KEEP:  # frozen: the checked value is set past its guard
                object.__setattr__(self, f.name, _convert(getattr(self, f.name), hints[f.name], f"{self.where()}.{f.name}"))


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict (YAML/JSON-serialisable)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; values of ``override`` win. Neither input is modified."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_dotlist(items: list[str]) -> dict:
    """``["train.lr=3e-4", "model.K=5"]`` -> nested dict with YAML-typed values."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{item}: override must look like key.path=value")
        key, raw = item.split("=", 1)
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _yaml_scalar(raw)
    return out


def _yaml_scalar(raw: str):
    try:
        value = yaml.safe_load(raw)  # the safe loader only
    except yaml.YAMLError as err:
        raise ConfigError(f"{raw!r}: not a plain YAML value ({str(err).splitlines()[0]})") from None
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string; users mean a number
        try:
            return float(value)
        except ValueError:
            pass
    return value


class _StrictLoader(yaml.SafeLoader):
    """The safe loader (a ``!!python/...`` tag is refused, never run) that also refuses a key
    given twice in one mapping, which YAML would otherwise resolve silently to the last value.
    Merge keys (``<<: *anchor``) still override as YAML defines."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


BASE_KEY = "base"  # a config file's key naming the config file it extends (read_config)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        with path.open() as fh:
            data = yaml.load(fh, Loader=_StrictLoader)  # safe, and no key twice
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML or not plain data ({' '.join(str(err).split())[:300]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def read_config(path: str | Path) -> dict:
    """A pipeline config file's mapping, with the file its ``base:`` key names merged under it.

    [choice] An experiment lives in a small file of its own that names the config it extends
    (``base: ../tiny.yaml``, relative to the file itself) and holds only what it adds or changes:
    the base's mapping is read (itself resolved the same way, to any depth) and the file's keys are
    merged over it as Snakemake merges ``--configfile A B`` (:func:`merge`: mappings key by key,
    any other value replaced). Every command that takes ``--config`` reads a file through here,
    and so does the Snakefile (:func:`resolve_configfiles`); docs/choices.md says why a key and not
    several files."""
    return config_chain(path)[0]


def config_chain(path: str | Path) -> tuple[dict, list[Path]]:
    """(the resolved mapping of config file ``path``, the files it was read from, ``path`` first and
    then its bases); a missing base, a base that is not a path, or a chain that comes back to a file
    of its own is one line naming the file and its ``base:``."""
    files: list[Path] = []
    layers: list[dict] = []
    path = Path(path)
    while True:
        if any(path.resolve() == f.resolve() for f in files):
            raise ConfigError(f"{files[-1]}: {BASE_KEY}: {path} extends itself "
                              f"(through {' -> '.join(map(str, files + [path]))})")
        data = load_yaml(path)
        files.append(path)
        base = data.pop(BASE_KEY, None)
        layers.append(data)
        if base is None:
            break
        if not isinstance(base, str) or not base.strip():
            raise ConfigError(f"{path}: {BASE_KEY}: expected the path of the config file it extends "
                              f"(relative to {path.parent or '.'}), got {base!r}")
        target = path.parent / base
        if not target.is_file():
            raise ConfigError(f"{path}: {BASE_KEY}: {base}: no such config file (read relative to the file's own "
                              f"folder: {target})")
        path = target
    out: dict = {}
    for layer in reversed(layers):
        out = merge(out, layer)
    return out, files


def resolve_configfiles(paths: list[str | Path], overrides: dict | None = None) -> dict | None:
    """The config Snakemake should hold for ``--configfile PATHS`` and ``--config`` ``overrides``,
    where any of the files names a ``base:`` (None where none does: Snakemake's own merge is then
    the same): each file resolved (:func:`read_config`), merged in order, the overrides last."""
    if not any(BASE_KEY in load_yaml(p) for p in paths):
        return None
    out: dict = {}
    for p in paths:
        out = merge(out, read_config(p))
    return merge(out, dict(overrides or {}))
