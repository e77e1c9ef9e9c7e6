"""Typed configs: pydantic v2 declares every setting once, YAML files hold values only.

Each section of a config file is a pydantic dataclass declared with :func:`section` (its fields'
types, bounds and one-line descriptions: ``Field(default, gt=0, description=...)``); the
declarations are the loader (:func:`from_dict`: unknown keys and wrong types refused), the JSON
Schema Snakemake validates and configs/README.md (config/schema.py). A refusal is one
:class:`ConfigError` line naming the key path (``model.d_modle: unknown key (allowed: ...)``). The
sections live in this folder: model.py, data.py, train.py, evaluate.py, resources.py (each stage's
job resources, the cluster), pipeline.py (scales, experiments, the benchmark), run.py (one run's
resolved config). A command's own flags are its ``Request`` (:class:`StageRequest`); how a run's
config resolves: ``resolve.resolve_run``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pydantic.dataclasses
import yaml
from pydantic import BeforeValidator, Strict, StrictBool, StrictInt


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type. The message names the key."""


# ----------------------------------------------------------------------------------------------
# The field types of a config: strict (no "8" for 8, no "yes" for true), as YAML writes values.

_YAML11_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


class _AlsoString:
    """A number's or a name's JSON Schema also admits the other kind: PyYAML reads 3e-4 (no dot)
    as a string, and 410 (a name like 410m without its letter) as a number."""

    def __init__(self, other: str) -> None:
        self.other = other

    def __get_pydantic_json_schema__(self, core_schema, handler):
        out = handler(core_schema)
        return {**out, "type": [out["type"], self.other]}


Int = StrictInt
Bool = StrictBool
# a number: an integer or float, or a string YAML 1.1 leaves unread (3e-4); never nan or inf (config: allow_inf_nan)
Float = Annotated[float, Strict(), BeforeValidator(lambda v: float(v) if isinstance(v, str) and _YAML11_FLOAT.match(v) else v),
                  _AlsoString("string")]
# a name or text: a number is read as its text (YAML reads 1.4b as a string but 410 as an int)
Text = Annotated[str, Strict(), BeforeValidator(lambda v: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v),
                 _AlsoString("number")]
STRICT = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)


def section(cls: type | None = None, *, key: str = "", frozen: bool = False) -> Any:
    """Declare a config section: a pydantic dataclass (``dataclasses.replace``, ``asdict`` and
    ``fields`` work as on any dataclass) that refuses unknown keys, checked on construction from
    Python too, where a refusal is a one-line :class:`ConfigError` as from a file, naming the key
    below ``key`` (the section's place in a config: ``train``)."""
    def declare(cls: type) -> type:
        cls.key = key
        cls = pydantic.dataclasses.dataclass(frozen=frozen, config=STRICT)(cls)
        init = cls.__init__

        @functools.wraps(init)
        def checked_init(self, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except pydantic.ValidationError as err:
                raise ConfigError(one_line(err, type(self), self.where() if hasattr(self, "where") else key)) from None

        cls.__init__ = checked_init
        return cls

    return declare if cls is None else declare(cls)


@functools.cache
def _adapter(cls: Any) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(cls)


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Section ``cls`` (a :func:`section`) of a mapping, checked by its declaration."""
    try:
        return _adapter(cls).validate_python({} if data is None else data)
    except pydantic.ValidationError as err:
        raise ConfigError(one_line(err, cls, where)) from None


def _type_at(cls: Any, loc: tuple) -> Any:
    """The annotation of the key at ``loc`` below section ``cls`` (for a refusal's words)."""
    tp = cls
    for part in loc:
        for kind in kinds_of(tp):
            if dataclasses.is_dataclass(kind) and part in typing.get_type_hints(kind):
                tp = typing.get_type_hints(kind)[part]
                break
            if typing.get_origin(kind) in (dict, list):
                tp = typing.get_args(kind)[-1 if typing.get_origin(kind) is dict else 0]
                break
    return tp


def _bound(kind: str, ctx: dict, tp: Any) -> str:
    limit = next(iter(ctx.values()))
    if kind == "greater_than" and limit == 0:
        return "must be positive" + (" or null" if type(None) in kinds_of(tp) else "")
    return f"must be {dict(greater_than='>', greater_than_equal='>=', less_than='<', less_than_equal='<=')[kind]} {limit}"


QUOTED = r"'([^']*)'"  # a choice in pydantic's list of a Literal's values


def one_line(err: pydantic.ValidationError, cls: Any, where: str = "") -> str:
    """The first refusal of a validation as one line: the key path, then what was wrong in the
    project's words (``train.lr: expected a number, got 'fast'``)."""
    e = err.errors(include_url=False)[0]
    kind, loc, got, ctx = e["type"], e["loc"], e.get("input"), e.get("ctx") or {}
    path = where
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    what = {"int_type": "expected an integer", "bool_type": "expected true/false", "float_type": "expected a number",
            "finite_number": "expected a finite number", "string_type": "expected a string"}.get(kind)
    if kind == "value_error":  # a section's own check (__post_init__): its message names the key below the section
        msg = str(ctx.get("error", e["msg"]))
        return msg if not path or msg.startswith(path) else f"{path}.{msg.split('.', 1)[-1]}"
    if kind in ("missing", "missing_argument"):
        text = "missing required key"
    elif kind in ("extra_forbidden", "unexpected_keyword_argument"):
        names = [f.name for k in kinds_of(_type_at(cls, loc[:-1])) if dataclasses.is_dataclass(k) for f in dataclasses.fields(k)]
        text = f"unknown key (allowed: {', '.join(sorted(names))})"
    elif kind in ("dict_type", "dataclass_type", "model_type", "dataclass_exact_type"):
        text = f"expected a mapping, got {type(got).__name__} {got!r}"
    elif kind in ("list_type", "tuple_type"):
        text = f"expected a list, got {type(got).__name__} {got!r}"
    elif kind == "literal_error":
        text = f"must be one of {', '.join(re.findall(QUOTED, ctx['expected']))}; got {got!r}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        tp = _type_at(cls, loc)
        text = f"{_bound(kind, ctx, tp)}, got {float(got) if float in kinds_of(tp) else got!r}"
    else:
        text = f"{what}, got {got!r}" if what else f"{e['msg'][0].lower()}{e['msg'][1:]}, got {got!r}"
    return f"{path}: {text}" if path else text


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
    """The base of a command's request (a frozen :func:`section`): its fields, declared with
    :func:`arg`, are the command's flags (commands.add_flags), and a stage's function takes it, so a
    stage is a Python API as well as a command. Values are checked by the declaration, built from
    Python as from flags."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        section(cls, frozen=True)

    @classmethod
    def where(cls) -> str:
        """The request's name in messages: its module below the package, and the class."""
        return f"{cls.__module__.removeprefix('stateloop.')}.{cls.__name__}"

    @classmethod
    def of(cls, args) -> Any:
        """The request of a command's parsed flags (an argparse namespace): each field from the
        attribute of the same name, its text read as the field's type (a bad number, or one its
        check refuses, is a one-line ConfigError naming the flag); a field the namespace lacks (a
        flag not given) keeps its default, a required one is a one-line ConfigError; attributes
        that are no field (the command's name) are left out."""
        hints, given = typing.get_type_hints(cls), vars(args)
        values = {f.name: _from_text(given[f.name], hints[f.name], flag_of(f))
                  for f in dataclasses.fields(cls) if f.init and f.name in given}
        for f in dataclasses.fields(cls):
            if (check := f.metadata.get("check")) and values.get(f.name) is not None and not check[0](values[f.name]):
                raise ConfigError(f"{flag_of(f)} must be {check[1]}, got {values[f.name]}")
        return from_dict(cls, values, cls.where())


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
