"""lm-eval's ``custom_dataset`` hooks: the YAMLs of ``workflow/tasks/`` run by lm-eval's own
command line, from any folder::

    stateloop lm-eval --model stateloop --model_args pretrained=RUN_DIR --tasks piqa_local \
        --include_path workflow/tasks

Each YAML names a hook of this module (``custom_dataset: !function
stateloop.evaluate.tasks.hooks.<task>_dataset``), which lm-eval calls instead of loading the
YAML's relative ``data_files``: it prepares the task's data as ``stateloop eval`` does
(:mod:`stateloop.evaluate.tasks.prepare`) into a temporary folder, with
``$STATELOOP_SHARED/data/...`` (default: ``../shared`` beside the checkout) as the source folder,
EvalConfig's defaults (``seed``, ``fewshot_pool`` and ``synthetic_examples`` can be set through
lm-eval's ``--metadata``) and, for the synthetic tasks, the generator settings of the evaluated
run's data (lm-eval passes ``--model_args``, so ``pretrained=RUN_DIR``, along).
:func:`~stateloop.evaluate.tasks.prepare.prepare_tasks` drops the hook from its written copies.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.evaluate import EvalConfig
from stateloop.data.shards import read_meta
from stateloop.evaluate.tasks.files import SHARED_SOURCES, default_shared_data
from stateloop.evaluate.tasks.prepare import PREPARERS, absolute_data_files
from stateloop.runs import has_final_weights, saved_run_config

METADATA_SETTINGS = ("seed", "fewshot_pool", "synthetic_examples")  # EvalConfig keys read from --metadata


def _run_data_meta(metadata: dict) -> dict | None:
    """meta.json of the data of the run named by ``pretrained=`` (or ``run_dir=``), if it is one."""
    run_dir = metadata.get("pretrained") or metadata.get("run_dir")
    if not isinstance(run_dir, str) or not has_final_weights(run_dir):
        return None
    data_dir = saved_run_config(run_dir).data.dir
    return read_meta(data_dir) if data_dir else None


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def local_dataset(task: str) -> Callable:
    """lm-eval's ``custom_dataset`` for local ``task`` (module docstring): called with the task's
    metadata (``--model_args`` and ``--metadata`` merged in) and its ``dataset_kwargs``."""
    def load(data_files=None, **metadata):
        import datasets

        where = f"local task {task}"
        if not isinstance(data_files, dict):
            raise ConfigError(f"{where}: dataset_kwargs.data_files must map splits to files")
        cfg = EvalConfig(**{k: int(metadata[k]) for k in METADATA_SETTINGS if k in metadata})
        source = default_shared_data() / SHARED_SOURCES[task] if task in SHARED_SOURCES else None
        if source is not None and not source.is_dir():
            raise FileNotFoundError(f"{source}: data folder of {task} not found (set STATELOOP_SHARED to the folder holding data/)")
        prep = PREPARERS.get(task)
        with tempfile.TemporaryDirectory(prefix=f"stateloop-{task}-") as tmp:
            folder = prep.prepare(Path(tmp), cfg, source, _run_data_meta(metadata)) if prep is not None else source
            files = absolute_data_files(data_files, folder, where)
            return datasets.DatasetDict({split: datasets.Dataset.from_list(
                [row for path in (paths if isinstance(paths, list) else [paths]) for row in _read_jsonl(path)])
                for split, paths in files.items()})

    load.__name__ = load.__qualname__ = f"{task}_dataset"
    return load


# The hooks the YAMLs of workflow/tasks/ name (`custom_dataset: !function stateloop.evaluate.tasks.hooks.<name>`).
synth_mc_dataset = local_dataset("synth_mc")
synth_cloze_dataset = local_dataset("synth_cloze")
lambada_openai_local_dataset = local_dataset("lambada_openai_local")
piqa_local_dataset = local_dataset("piqa_local")
wikitext_local_dataset = local_dataset("wikitext_local")
