"""The datasets of lm-eval tasks as a Hub need (data/hub.py): fetched by lm-eval's own download,
checked offline by building each task's dataset from the cache."""

from __future__ import annotations

import contextlib
import tempfile

from stateloop.config import ConfigError
from stateloop.data.hub import Need
from stateloop.evaluate.tasks.prepare import prepare_tasks


@contextlib.contextmanager
def _prepared(tasks: list[str], eval_cfg):
    """The tasks as ``stateloop eval`` prepares them (evaluate/tasks/prepare.py), in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="stateloop-prefetch-") as tmp:
        yield prepare_tasks(list(tasks), tmp, eval_cfg)


def _task_datasets(prepared, tasks: list[str]) -> dict[str, tuple | None]:
    """Task -> (dataset_path, dataset_name, dataset_kwargs) lm-eval loads it from; None where the
    task's config does not say (a group), which is then checked by building it."""
    out = {}
    for name in tasks:
        entry = prepared.task_manager.task_index.get(name)
        cfg = dict((entry.cfg if entry is not None else None) or {})
        if not cfg.get("dataset_path") or cfg.get("custom_dataset"):
            out[name] = None
            continue
        kwargs = {k: v for k, v in dict(cfg.get("dataset_kwargs") or {}).items() if k != "trust_remote_code"}
        out[name] = (cfg["dataset_path"], cfg.get("dataset_name"), kwargs)
    return out


@contextlib.contextmanager
def _quiet_datasets():
    import datasets

    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)


def task_needs(tasks: list[str], eval_cfg, where: str = "eval") -> list[Need]:
    """The datasets of lm-eval tasks ``tasks`` under the eval settings ``eval_cfg``: one need for
    them all (lm-eval's task index is built once)."""
    tasks = list(tasks)
    if not tasks:
        return []

    def fetch() -> str:
        from lm_eval.tasks import get_task_dict

        with _prepared(tasks, eval_cfg) as prepared:
            get_task_dict(tasks, prepared.task_manager)  # each task's download(): datasets.load_dataset
        return f"lm-eval tasks {', '.join(tasks)}"

    def check() -> str | None:
        import datasets

        missing = []
        try:
            with _prepared(tasks, eval_cfg) as prepared, _quiet_datasets():
                for task, spec in _task_datasets(prepared, tasks).items():
                    try:
                        if spec is None:
                            from lm_eval.tasks import get_task_dict

                            get_task_dict([task], prepared.task_manager)
                        else:
                            datasets.load_dataset_builder(spec[0], spec[1], **spec[2])
                    except Exception:  # noqa: BLE001 - not cached (or not readable): named below
                        shown = f" ({spec[0]}" + (f", {spec[1]}" if spec and spec[1] else "") + ")" if spec else ""
                        missing.append(f"{task}{shown}")
        except (ConfigError, FileNotFoundError) as err:
            return f"lm-eval tasks of {where}: {err}"
        return f"lm-eval task data {', '.join(missing)}" if missing else None

    return [Need(f"lm-eval tasks {', '.join(tasks)}", fetch, check, repr((tasks, eval_cfg)))]
