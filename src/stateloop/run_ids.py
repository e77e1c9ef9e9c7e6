"""The run id, spelled here once: a cell (every seed of one shape) and the seed, always last.

A run is (scale, model, K, d_s, seed), d_s = 0 without a persistent state (experiments.py expands
a config's experiments into runs); its folder is ``RUNS_ROOT/<run id>``."""

from __future__ import annotations

import re

from stateloop.config import ConfigError

RUN_CELL_FORM = "{scale}/{model}/K{K}_ds{ds}"
RUN_ID_FORM = RUN_CELL_FORM + "_seed{seed}"
_ID_FIELDS = {"scale": r"[^/\s]+", "model": r"[a-z0-9_]+", "K": r"\d+", "ds": r"\d+", "seed": r"\d+"}
# Matched whole (fullmatch): a pattern ending in $ would also match before a final newline.
_RUN_ID = re.compile(re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m[1]}>{_ID_FIELDS[m[1]]})", RUN_ID_FORM))
RUN_ID_EXAMPLE = "tiny/stateloop/K3_ds64_seed1234"
RUNS_ROOT = "results/runs"  # a run id's folder: RUNS_ROOT/<run id>, relative to the working directory
# RUN in every command that addresses runs (train, eval, analyze, bench decode --runs); runs.resolve_run_arg decides.
RUN_HELP = f"a run folder, or a run id {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}; its folder {RUNS_ROOT}/<id>)"


def parse_run_id(run_id: str) -> tuple[str, str, int, int, int] | None:
    """(scale, model, K, d_s, seed) of a run id (RUN_ID_FORM), or None: the one parser of run ids."""
    m = _RUN_ID.fullmatch(run_id)
    return (m["scale"], m["model"], int(m["K"]), int(m["ds"]), int(m["seed"])) if m else None


def split_run_id(run_id: str) -> tuple[str, str, int, int, int]:
    """(scale, model, K, d_s, seed) of a run id (RUN_ID_FORM); one line when it is not one."""
    parts = parse_run_id(run_id)
    if parts is None:
        raise ConfigError(f"RUN: expected {RUN_ID_FORM} (e.g. {RUN_ID_EXAMPLE}), got {run_id!r}")
    return parts
