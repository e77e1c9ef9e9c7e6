"""The files of the offline lm-eval tasks: their YAMLs and the shared data they read.

Every module of the package reads them: :mod:`~stateloop.evaluate.tasks.prepare` makes the YAMLs
of ``workflow/tasks/`` runnable for one evaluation, :mod:`~stateloop.evaluate.tasks.hooks` hooks
them into lm-eval's own command line, and a rehearsal (:mod:`stateloop.ops.rehearse.run`,
:mod:`stateloop.ops.rehearse.task_data`) copies them beside lm-eval's own tasks that it writes
over small excerpts of the same shared files. This module imports none of them (nor lm-eval), so
that each, and the test suite, imports it at the top of its file:

- the checkout (:data:`REPO`) and its local task folder (:data:`DEFAULT_TASK_DIR`), whose YAMLs
  are read and written with lm-eval's ``!function`` tags kept as they are (:func:`task_yamls`,
  :func:`read_task_yaml`, :func:`dump_task_yaml`);
- the shared data folder (:func:`default_shared_data`: ``$STATELOOP_SHARED/data``, by default
  ``../shared/data`` beside the checkout), the folder in it of each local task's source
  (:data:`SHARED_SOURCES`) and readers of the files in it that both sides use: PIQA's dev split
  with its labels (:func:`piqa_dev`) and WikiText's articles (:func:`wikitext_pages`);
- :func:`write_jsonl`, the JSON-lines files both write their task data as;
- :func:`lm_eval_task_files`, the installed lm-eval YAML that defines each of a few task names,
  found by a text scan (so that a task manager indexes only their folders).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

from stateloop.config import ConfigError
from stateloop.files import atomic_write_bytes

REPO = Path(__file__).resolve().parents[4]
DEFAULT_TASK_DIR = REPO / "workflow" / "tasks"
# local task -> its source folder under default_shared_data()
SHARED_SOURCES = {"lambada_openai_local": "lambada-openai", "piqa_local": "piqa", "wikitext_local": "wikitext-2"}


def default_shared_data() -> Path:
    return Path(os.environ.get("STATELOOP_SHARED", REPO.parent / "shared")) / "data"


# ----------------------------------------------------------------------------------------------
# YAML with lm-eval's `!function module.name` tags kept as they are


class FunctionTag(str):
    """The text of a ``!function`` tag (resolved by lm-eval relative to the YAML's folder)."""


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.add_constructor("!function", lambda loader, node: FunctionTag(loader.construct_scalar(node)))
_Dumper.add_representer(FunctionTag, lambda dumper, data: dumper.represent_scalar("!function", str(data)))


def load_task_yaml(path: str | Path):
    """The content of a YAML file, ``!function`` tags as :class:`FunctionTag`."""
    try:
        return yaml.load(Path(path).read_text(), Loader=_Loader)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None


def dump_task_yaml(spec: dict) -> str:
    """``spec`` as YAML, its :class:`FunctionTag` values as ``!function`` tags again."""
    return yaml.dump(spec, Dumper=_Dumper, sort_keys=False)


def read_task_yaml(path: Path) -> dict:
    data = load_task_yaml(path)
    if not isinstance(data, dict) or "task" not in data:
        raise ConfigError(f"{path}: not an lm-eval task (no `task:` key)")
    return data


def task_yamls(task_dir: Path) -> dict[str, Path]:
    """Task name -> YAML file, for every task in ``task_dir``."""
    out = {}
    for path in sorted(task_dir.glob("*.yaml")):
        name = read_task_yaml(path)["task"]
        if name in out:
            raise ConfigError(f"{path}: task {name!r} is also defined in {out[name]}")
        out[name] = path
    return out


# ----------------------------------------------------------------------------------------------
# The shared data files


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """``rows`` as UTF-8 JSON lines, written atomically (parent folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode())


def piqa_dev(folder: Path, hint: str) -> list[dict]:
    """PIQA's original dev split in ``folder``: ``valid.jsonl`` (goal, sol1, sol2) with the
    ``label`` of each question from ``valid-labels.lst`` (one 0/1 per line), which that split
    keeps in a separate file. ``hint`` says, in the error for a missing file, where it belongs."""
    docs_path, labels_path = folder / "valid.jsonl", folder / "valid-labels.lst"
    for p in (docs_path, labels_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: missing ({hint})")
    docs = [json.loads(line) for line in docs_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    labels = [int(x) for x in labels_path.read_text(encoding="utf-8").split()]
    if len(docs) != len(labels):
        raise ConfigError(f"{labels_path}: {len(labels)} labels for {len(docs)} questions in {docs_path}")
    return [{**d, "label": y} for d, y in zip(docs, labels)]


_HEADING = re.compile(r"^ = [^=].* = $")


def wikitext_pages(text: str) -> list[str]:
    """Articles of a WikiText token file: a new one starts at every top-level heading line
    (`` = Title = ``); each keeps its lines (with their newlines) as in the file."""
    pages, current = [], []
    for line in text.splitlines(keepends=True):
        if _HEADING.match(line.rstrip("\n")) and any(l.strip() for l in current):
            pages.append("".join(current))
            current = []
        current.append(line)
    if any(l.strip() for l in current):
        pages.append("".join(current))
    return pages


# ----------------------------------------------------------------------------------------------
# lm-eval's installed task tree, scanned as text

LM_EVAL_SKIPPED = {"__pycache__", ".ipynb_checkpoints"}  # folders lm-eval's own index skips


def _scalar(value: str) -> str:
    return value.split(" #", 1)[0].strip().strip("'\"")


def _registers(text: str, name: str) -> str | None:
    """How a YAML's top level registers ``name`` in lm-eval's index: ``"task"`` (``task: name``),
    ``"group"`` (``group: name``), ``"tag"`` (``name`` in ``tag:``, inline, a flow list or a block
    list), or None."""
    key = None
    for line in text.splitlines():
        if line[:1] not in ("", " ", "\t", "-", "#"):
            key, _, value = line.partition(":")
            key, value = _scalar(key), value.strip()
            items = value[1:-1].split(",") if key == "tag" and value.startswith("[") and value.endswith("]") else [value]
            if key in ("task", "group", "tag") and name in (_scalar(v) for v in items):
                return key
        elif key == "tag" and line.lstrip().startswith("-") and _scalar(line.lstrip()[1:]) == name:
            return "tag"
    return None


def lm_eval_task_files(names: Iterable[str]) -> dict[str, Path] | None:
    """Task name -> the one YAML of the installed lm-eval's task tree whose top level says
    ``task: <name>``; None when a name cannot be placed that way (a group, a tag, a ``task:`` list,
    a python class, an unknown name, more than one such file).

    [choice] lm-eval's whole tree is ~14,000 YAMLs (11 CPU-s to index); reading bytes and parsing
    only those holding a requested name takes 0.45 CPU-s for the paper's nine tasks
    (benchmarks/records/2026-12-04-lm-eval-task-index.md).
    [assume] No YAML of another folder registers a requested name through a template it includes
    (none does in lm-eval 0.4.13 for the tasks the test suite compares with the whole index)."""
    names = list(dict.fromkeys(names))
    spec = importlib.util.find_spec("lm_eval")
    if not names or spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tasks"
    needles = {n: n.encode() for n in names}
    found: dict[str, list[Path]] = {n: [] for n in names}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in LM_EVAL_SKIPPED]
        for file in files:
            if not file.endswith(".yaml"):
                continue
            path = Path(folder) / file
            data = path.read_bytes()
            for name in (n for n, b in needles.items() if b in data):
                kind = _registers(data.decode("utf-8", "replace"), name)
                if kind in ("group", "tag"):
                    return None
                if kind == "task":
                    found[name].append(path)
    if any(len(paths) != 1 for paths in found.values()):
        return None
    return {name: paths[0] for name, paths in found.items()}
