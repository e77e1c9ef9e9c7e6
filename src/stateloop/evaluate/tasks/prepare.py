"""The YAMLs of ``workflow/tasks/`` made runnable for one evaluation (``stateloop eval``).

lm-eval resolves a local task's ``dataset_kwargs.data_files`` against the *current directory*,
not the YAML's folder. So the YAMLs in ``workflow/tasks/`` name their files relative to the
task's data folder, and :func:`prepare_tasks` writes a runnable copy of each into a work folder
with every path made absolute. A task's data folder is

- for the synthetic tasks (``synth_mc``, ``synth_cloze``): a folder this module fills with
  examples from the synthetic corpus's generator (``stateloop.data.synthetic.task_examples``),
  a few-shot pool from its ``train`` split and held-out test examples from its ``test`` split;
- for ``piqa_local``: a folder this module fills with PIQA's ``valid.jsonl`` joined with
  ``valid-labels.lst`` (the original dev split keeps its labels in a separate file);
- for ``wikitext_local``: a folder this module fills with one JSON line per article of
  WikiText-2's ``test.txt``, split at its top-level headings (as EleutherAI's document-level copy
  of WikiText is);
- otherwise (``lambada_openai_local``, or any YAML you add): ``eval.task_data[task]``, the
  source folder itself; a YAML whose data files are all absolute paths (as
  :mod:`stateloop.ops.rehearse.task_data` writes them) needs no ``task_data``.

A local YAML may ``include:`` another one (a relative include is made absolute, as its copy is
written elsewhere), e.g. lm-eval's own YAML of a task with only its data source overridden; its
``output_type`` is then read through the include. A name in ``eval.task_dir`` is always the
local task, even where lm-eval has a built-in task of that name: the task manager indexes only
the local YAMLs when every requested task is local, and otherwise lists them after lm-eval's
folders of the requested built-in tasks (:func:`task_manager`), which lets them override the
built-ins (checked after indexing).

Tasks not in ``workflow/tasks/`` are lm-eval's own (downloaded from the Hugging Face Hub).

lm-eval's own command line prepares the same data through each YAML's ``custom_dataset`` hook
(:mod:`stateloop.evaluate.tasks.hooks`); :func:`prepare_tasks` drops the hook from its written
copies.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.data import SyntheticConfig
from stateloop.config.evaluate import EvalConfig
from stateloop.data.synthetic import task_examples
from stateloop.evaluate.tasks.files import (
    DEFAULT_TASK_DIR,
    FunctionTag,
    dump_task_yaml,
    lm_eval_task_files,
    load_task_yaml,
    piqa_dev,
    read_task_yaml,
    task_yamls,
    wikitext_pages,
    write_jsonl,
)

# The synthetic generator's splits: the few-shot pool and the held-out examples.
SYNTH_FEWSHOT_SPLIT = "train"
SYNTH_HELDOUT_SPLIT = "test"


# ----------------------------------------------------------------------------------------------
# Preparing the data of the local tasks


def synthetic_config(data_meta: dict | None):
    """The generator settings the run's corpus was made with (meta.json's ``source``), so the
    evaluation items are drawn from the distribution the model was trained on; the generator's
    defaults when the run's data is not synthetic."""
    source = (data_meta or {}).get("source") or {}
    if source.get("kind") != "synthetic":
        return SyntheticConfig()
    keys = {"mix", "max_hops", "max_steps"}
    return SyntheticConfig(**{k: v for k, v in source.items() if k in keys})


def _synthetic(task: str) -> Callable:
    def prepare(folder: Path, cfg: EvalConfig, source: Path | None, data_meta: dict | None) -> Path:
        gen = synthetic_config(data_meta)
        write_jsonl(folder / "train.jsonl", task_examples(task, SYNTH_FEWSHOT_SPLIT, cfg.fewshot_pool, cfg.seed, gen))
        write_jsonl(folder / "test.jsonl", task_examples(task, SYNTH_HELDOUT_SPLIT, cfg.synthetic_examples, cfg.seed, gen))
        return folder

    return prepare


def _piqa(folder: Path, cfg: EvalConfig, source: Path | None, data_meta: dict | None) -> Path:
    """valid.jsonl (goal, sol1, sol2) + valid-labels.lst (one 0/1 per line) -> valid.jsonl with `label`."""
    hint = "eval.task_data.piqa_local must hold PIQA's valid.jsonl and valid-labels.lst"
    write_jsonl(folder / "valid.jsonl", piqa_dev(source, hint))
    return folder


def _wikitext(folder: Path, cfg: EvalConfig, source: Path | None, data_meta: dict | None) -> Path:
    path = source / "test.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (eval.task_data.wikitext_local must hold WikiText-2's test.txt)")
    write_jsonl(folder / "test.jsonl", [{"page": p} for p in wikitext_pages(path.read_text(encoding="utf-8"))])
    return folder


@dataclass(frozen=True)
class Preparer:
    prepare: Callable  # (work folder, EvalConfig, source folder or None, the data's meta.json) -> data folder
    needs_source: bool  # reads eval.task_data[task]


PREPARERS: dict[str, Preparer] = {
    "synth_mc": Preparer(_synthetic("synth_mc"), False),
    "synth_cloze": Preparer(_synthetic("synth_cloze"), False),
    "piqa_local": Preparer(_piqa, True),
    "wikitext_local": Preparer(_wikitext, True),
}


# ----------------------------------------------------------------------------------------------
# A task manager over the chosen tasks


@dataclass
class PreparedTasks:
    task_manager: object  # lm_eval.tasks.TaskManager
    local: dict[str, Path]  # local task -> the runnable YAML written for it
    builtin: list[str]  # lm-eval's own tasks
    output_types: dict[str, str]  # task -> lm-eval output_type


def absolute_data_files(spec, folder: Path, where: str):
    if isinstance(spec, str):
        path = Path(spec) if Path(spec).is_absolute() else folder / spec
        if not path.is_file():
            raise FileNotFoundError(f"{path}: data file of {where} not found")
        return str(path.resolve())
    if isinstance(spec, list):
        return [absolute_data_files(s, folder, where) for s in spec]
    if isinstance(spec, dict):
        return {k: absolute_data_files(v, folder, where) for k, v in spec.items()}
    raise ConfigError(f"{where}: dataset_kwargs.data_files must be a path, list or mapping")


def _relative_data_files(spec) -> bool:
    """Whether any path of a ``data_files`` spec is relative (to be resolved against a data folder)."""
    if isinstance(spec, str):
        return not Path(spec).is_absolute()
    if isinstance(spec, list):
        return any(_relative_data_files(s) for s in spec)
    if isinstance(spec, dict):
        return any(_relative_data_files(s) for s in spec.values())
    return False


def _absolute_includes(spec, yaml_dir: Path, where: str):
    """``include:`` (a path or a list) with relative paths made absolute against the YAML's folder."""
    def one(inc):
        if not isinstance(inc, str):
            raise ConfigError(f"{where}: include must name YAML files")
        path = Path(inc) if Path(inc).is_absolute() else (yaml_dir / inc).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{path}: included by {where}, not found")
        return str(path)

    return [one(i) for i in spec] if isinstance(spec, list) else one(spec)


def _merged_config(spec: dict, seen: tuple = ()) -> dict:
    """A task config with its (absolute) includes merged in, local keys winning, as lm-eval merges them."""
    includes = spec.get("include")
    merged: dict = {}
    for inc in (includes if isinstance(includes, list) else [includes] if includes else []):
        if inc in seen:
            raise ConfigError(f"{inc}: include cycle")
        data = load_task_yaml(inc)
        if isinstance(data, dict) and data.get("include"):
            data["include"] = _absolute_includes(data["include"], Path(inc).parent, inc)
        merged.update(_merged_config(data if isinstance(data, dict) else {}, (*seen, inc)))
    merged.update({k: v for k, v in spec.items() if k != "include"})
    return merged


def task_manager(builtin: list[str], include_path: list[str] = ()):
    """An lm-eval TaskManager that knows lm-eval's own tasks ``builtin`` and every task of the
    folders ``include_path``, which override built-in tasks of the same name.

    [choice] Only the folders of lm-eval's tree holding the YAMLs of ``builtin`` are indexed
    (:func:`~stateloop.evaluate.tasks.files.lm_eval_task_files`); where that cannot place every
    name, lm-eval's whole folder is, as lm-eval does by default."""
    from lm_eval.tasks import TaskManager

    files = lm_eval_task_files(builtin) if builtin else None
    if files is not None:
        parents = sorted({p.parent for p in files.values()})
        folders = [str(f) for f in parents if not any(o in f.parents for o in parents)]
        tm = TaskManager(include_path=[*folders, *include_path], include_defaults=False)
        if all((e := tm.task_index.get(n)) is not None and e.kind.name in ("TASK", "PY_TASK") and e.yaml_path is not None
               and Path(e.yaml_path).resolve() == files[n].resolve() for n in builtin):
            return tm
    return TaskManager(include_path=list(include_path) or None, include_defaults=bool(builtin))


def prepare_tasks(tasks: list[str], work_dir: str | Path, cfg: EvalConfig, data_meta: dict | None = None):
    """Write runnable YAMLs (absolute data paths) for the local ones among ``tasks`` into
    ``work_dir`` and return a :class:`PreparedTasks` whose task manager knows every task.
    ``data_meta``: the run's data folder's meta.json (the synthetic tasks follow its generator)."""
    work_dir = Path(work_dir).resolve()
    task_dir = Path(cfg.task_dir) if cfg.task_dir else DEFAULT_TASK_DIR
    if not task_dir.is_dir():
        raise FileNotFoundError(f"{task_dir}: local task folder not found (eval.task_dir)")
    available = task_yamls(task_dir)
    for name in cfg.task_data:
        if name not in available:
            raise ConfigError(f"eval.task_data.{name}: no local task of that name in {task_dir}")
    local, builtin, output_types = {}, [], {}
    yaml_dir = work_dir / "yaml"
    if yaml_dir.exists():
        shutil.rmtree(yaml_dir)
    yaml_dir.mkdir(parents=True)
    for name in tasks:
        if name not in available:
            builtin.append(name)
            continue
        spec = read_task_yaml(available[name])
        spec.pop("custom_dataset", None)  # lm-eval's own command line reads the data through it; here: data_files
        where = f"task {name} ({available[name]})"
        if "include" in spec:
            spec["include"] = _absolute_includes(spec["include"], available[name].parent, where)
        kwargs = dict(spec.get("dataset_kwargs") or {})
        # Data files named with absolute paths (here or in an included YAML) need no eval.task_data.
        effective = dict(_merged_config(spec).get("dataset_kwargs") or {}) if "include" in spec else kwargs
        source = Path(cfg.task_data[name]) if name in cfg.task_data else None
        prep = PREPARERS.get(name)
        needs_source = prep.needs_source if prep is not None else (
            "data_files" not in effective or _relative_data_files(effective["data_files"]))
        if source is None and needs_source:
            raise ConfigError(f"eval.task_data.{name}: missing (the folder holding the data of local task {name})")
        if source is not None and not source.is_dir():
            raise FileNotFoundError(f"{source}: data folder of {name} not found (eval.task_data.{name})")
        folder = prep.prepare(work_dir / name, cfg, source, data_meta) if prep is not None else source
        if "data_files" in kwargs:
            kwargs["data_files"] = absolute_data_files(kwargs["data_files"], folder or available[name].parent, where)
            spec["dataset_kwargs"] = kwargs
        # lm-eval imports `!function` modules relative to the YAML: keep each task's YAML beside them.
        out = (folder if any(isinstance(v, FunctionTag) for v in spec.values()) and prep is not None else yaml_dir) / f"{name}.yaml"
        out.write_text(f"# written by stateloop eval from {available[name]}\n" + dump_task_yaml(spec))
        local[name] = out
    tm = task_manager(builtin, sorted({str(p.parent) for p in local.values()}))
    for name, out in local.items():
        entry = tm.task_index.get(name)
        if entry is None or entry.yaml_path is None or Path(entry.yaml_path).resolve() != out.resolve():
            found = "nothing" if entry is None else str(entry.yaml_path)
            raise ConfigError(f"{available[name]}: lm-eval did not index local task {name!r} from its written copy {out} "
                              f"(it found {found}); check the YAML's include: and !function references")
        output_types[name] = (entry.cfg or {}).get("output_type", "")
    for name in builtin:
        entry = tm.task_index.get(name)
        if entry is None:
            raise ConfigError(f"eval.tasks: unknown task {name!r} (not in {task_dir} and not an lm-eval task)")
        output_types[name] = (entry.cfg or {}).get("output_type", "")
    return PreparedTasks(tm, local, builtin, output_types)
