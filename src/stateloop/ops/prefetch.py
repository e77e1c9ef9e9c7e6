"""``stateloop prefetch``: fetch what a config's jobs read from the Hugging Face Hub (data/hub.py,
evaluate/tasks/needs.py) where the network is, so that they can run offline."""

from __future__ import annotations

import os
import sys

from stateloop.config import ConfigError
from stateloop.data.hub import Need, NotPrefetched, caches, data_needs, offline, say
from stateloop.evaluate.tasks.needs import task_needs

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def go_offline() -> None:
    """Switch the Hub off in this process for good, as a compute node without network has it:
    the variables huggingface_hub, datasets and transformers read when they are imported, and,
    where huggingface_hub or datasets is imported already, the flags they read at each call
    (transformers asks huggingface_hub). Nothing after this
    opens a connection to the Hub (``stateloop prefetch --check`` calls it before anything else;
    without it, datasets tries the Hub with retries for each task: minutes with no route)."""
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import constants

        constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
        datasets.config.HF_DATASETS_OFFLINE = True


def config_needs(pipeline, runs: dict, scales: list[str] | None = None) -> list[Need]:
    """Every need of the config's trained runs' scales (``scales``: only these): their data
    stage's, and their lm-eval tasks where a run of the scale scores them."""
    names = list(dict.fromkeys(r.scale for r in runs.values()))
    if scales:
        unknown = [s for s in scales if s not in pipeline.scales]
        if unknown:
            raise ConfigError(f"--scales: {unknown[0]!r} is not a scale of the config (has: {', '.join(pipeline.scales)})")
        names = [s for s in names if s in scales]
    out: dict[str, Need] = {}  # by key: two needs of one key are one
    for name in names:
        scale = pipeline.scales[name]
        scored = any(r.scale == name and (r.scores_tasks() or r.scores_tasks(depths=True)) for r in runs.values())
        for need in data_needs(scale.data) + (task_needs(scale.eval.tasks, scale.eval, f"scales.{name}.eval")
                                              if scored else []):
            out.setdefault(need.key or need.what, need)
    return list(out.values())


def prefetch(needs: list[Need], config: str) -> int:
    """Fetch every need (online), then check each as a job would offline. 0 when all are there."""
    if offline():
        raise ConfigError("prefetch: the Hub is switched off here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); "
                          "run it where the network is, with those unset")
    if not needs:
        say(f"{config}: nothing to fetch (no hub tokenizer, dataset or lm-eval task data)")
        return 0
    say(f"into {caches()}")
    for need in needs:
        say(need.fetch())
    missing = [m for need in needs if (m := need.check()) is not None]
    if missing:
        raise NotPrefetched(f"fetched, but not found in the caches after: {'; '.join(missing)}")
    say(f"{len(needs)} needs of {config} are in the caches: the jobs can run offline (HF_HUB_OFFLINE=1)")
    return 0
