"""lm-eval's tasks' datasets as hub repositories under their real names, for the stand-in hub.

:func:`write_task_repos` writes, for the tasks a rehearsal evaluates, one folder per dataset that
lm-eval's own task YAMLs name (``dataset_path``, ``dataset_name``), in the layout ``datasets``
resolves from a script-free Hub repository (a README whose ``configs:`` map each config and split
to ``{config}/{split}-00000-of-00001.parquet``), with the schema and content of
:mod:`stateloop.ops.rehearse.task_data`. Tasks that share a dataset share its folder. The
evaluation jobs then read lm-eval's unchanged YAMLs offline from the caches, as on a compute node.
``datasets`` 4+ refuses repositories with loading scripts, and lm-eval's YAMLs name script-free
ones (lm-eval's issue #3171 lists those that still fail, none read here). ``tasks.json`` records
each task's repository, config, files and sources. Only the schema is real.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from stateloop.config import ConfigError
from stateloop.evaluate.tasks.files import DEFAULT_TASK_DIR, task_yamls
from stateloop.ops.rehearse.task_data import MIN_EXAMPLES, SOURCES, check_records, lm_eval_yamls, task_splits

CARD = "README.md"
MANIFEST = "tasks.json"
DEFAULT_CONFIG = "default"


def repo_folder(out_dir: Path, repo_id: str) -> Path:
    return out_dir / repo_id.replace("/", "--")


def data_file(config: str, split: str) -> str:
    """A split's file inside its repository, as the Hub's parquet datasets name them."""
    folder = "data" if config == DEFAULT_CONFIG else config
    return f"{folder}/{split}-00000-of-00001.parquet"


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(path)


def card(configs: dict[str, dict[str, str]]) -> str:
    """A dataset card whose ``configs:`` give each config's split files (``config -> split -> file``)."""
    entries = [{"config_name": name, "data_files": [{"split": s, "path": p} for s, p in files.items()]}
               for name, files in configs.items()]
    front = yaml.safe_dump({"configs": entries}, sort_keys=False)
    return (f"---\n{front}---\n# Rehearsal stand-in\n\nSmall data in this dataset's record schema, written by "
            f"stateloop.ops.rehearse.tasks for an offline rehearsal; it measures nothing.\n")


def hub_tasks(tasks: list[str], task_dir: str | Path | None = None) -> list[str]:
    """The tasks among ``tasks`` that read a Hub dataset: not local tasks of ``task_dir``
    (``eval.task_dir``; None: workflow/tasks/)."""
    local = task_yamls(Path(task_dir) if task_dir else DEFAULT_TASK_DIR)
    return [t for t in dict.fromkeys(tasks) if t not in local]


def write_task_repos(tasks: list[str], out_dir: str | Path, shared_data: str | Path,
                     n_examples: int = 20) -> dict[str, Path]:
    """Write the Hub datasets lm-eval's ``tasks`` read (see the module docstring; local tasks
    filtered out by :func:`hub_tasks`) into ``out_dir`` (each repository's folder replaced);
    returns ``repo_id -> folder``. A task not in :data:`~stateloop.ops.rehearse.task_data.SOURCES`
    is a :class:`ConfigError` (its data cannot be made here)."""
    if n_examples < MIN_EXAMPLES:
        raise ValueError(f"n_examples: at least {MIN_EXAMPLES} (five-shot prompts need five examples besides the scored one)")
    out_dir, shared_data = Path(out_dir).resolve(), Path(shared_data).resolve()
    names = list(dict.fromkeys(tasks))
    unknown = [t for t in names if t not in SOURCES]
    if unknown:
        raise ConfigError(f"no rehearsal data for lm-eval task(s) {', '.join(unknown)}: neither a local task of "
                         f"eval.task_dir nor rehearsable (rehearsable: {', '.join(SOURCES)})")
    installed = lm_eval_yamls(names) if names else {}
    tables: dict[str, dict[str, list[dict]]] = {}  # repo -> file -> records
    configs: dict[str, dict[str, dict[str, str]]] = {}  # repo -> config -> split -> file
    manifest = {}
    for name in names:
        source = SOURCES[name]
        lm_yaml, cfg = installed[name]
        repo_id, config = cfg.get("dataset_path"), cfg.get("dataset_name")
        if (repo_id, config) != source.dataset:
            raise ConfigError(f"{lm_yaml}: lm-eval's {name} reads {repo_id} ({config}), not "
                             f"{source.dataset[0]} ({source.dataset[1]}) whose schema is written here")
        kwargs = {k: v for k, v in dict(cfg.get("dataset_kwargs") or {}).items() if k != "trust_remote_code"}
        if kwargs:
            raise ConfigError(f"{lm_yaml}: lm-eval's {name} loads its dataset with {', '.join(sorted(kwargs))}, "
                             f"which a rehearsal repository does not reproduce")
        config = config or DEFAULT_CONFIG
        files = configs.setdefault(repo_id, {}).setdefault(config, {})
        written = tables.setdefault(repo_id, {})
        splits = {}
        for split in task_splits(cfg):
            path = files.setdefault(split, data_file(config, split))
            if path not in written:  # two tasks over one config and split: written once
                rows = source.records(split, n_examples, shared_data)
                if not rows:
                    raise ValueError(f"{name}: no records for split {split!r} from {source.origin}")
                check_records(name, rows)
                written[path] = rows
            splits[split] = {"file": path, "records": len(written[path])}
        manifest[name] = {"repo": repo_id, "config": config, "yaml": str(lm_yaml), "origin": source.origin,
                          "evaluated_split": cfg.get("test_split") or cfg.get("validation_split"), "splits": splits}
    repos = {}
    for repo_id, repo_configs in configs.items():
        folder = repo_folder(out_dir, repo_id)
        if folder.exists():  # a file of an earlier rehearsal would be served too
            shutil.rmtree(folder)
        for path, rows in tables[repo_id].items():
            _write_parquet(folder / path, rows)
        (folder / CARD).write_text(card(repo_configs), encoding="utf-8")
        repos[repo_id] = folder
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return repos
