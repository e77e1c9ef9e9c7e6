"""What the analyses of a trained run share: the held-out set, the calibration sample, MLflow logging.

The paper's analyses run "on the full Pile validation set" and "all analyses share an unmodified
baseline" with Table 4 (PPL 9.04), so both evaluate exactly the windows of ``stateloop eval``'s
held-out perplexity (:func:`heldout_protocol`), and record the unmodified model's NLL as a
``heldout`` block with eval.json's keys. The calibration sample (interventions, eq. 15) comes from
``train``, disjoint from any held-out split by construction (:func:`sampled_windows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stateloop.config import ConfigError
from stateloop.data.shards import open_split, sha256_file, window_count
from stateloop.runs import FINAL_WEIGHTS, run_id_of, trained_length
from stateloop.tracking.stages import log_stage

if TYPE_CHECKING:
    from stateloop.config.pipeline import PipelineConfig
    from stateloop.config.run import RunConfig

CALIB_SPLIT = "train"  # the split the calibration statistics come from (disjoint from any held-out split)
CALIB_WINDOWS = 64  # calibration windows, sampled over the whole calibration split
CALIB_SEED = 0


@dataclass
class HeldoutProtocol:
    """How a run's held-out perplexity is measured (the ``eval`` section of its scale)."""

    split: str  # eval.heldout_split
    max_windows: int | None  # eval.heldout_windows (None: the whole split)
    seq_len: int  # eval.max_length, else the run's train.seq_len, else model.max_seq_len
    batch_size: int  # eval.batch_size
    precision: str  # eval.precision: "32-true" | "bf16-mixed"


# All that the analyses read of the ``eval`` section (the DAG reruns them when one changes).
HELDOUT_KEYS = ("heldout_split", "heldout_windows", "max_length", "batch_size", "precision")


def heldout_protocol(config: RunConfig, model) -> HeldoutProtocol:
    """The held-out protocol of ``stateloop eval RUN_DIR [--config FILE]``: ``config.eval`` as
    resolve.resolve_eval resolves it."""
    split, windows, max_length, batch_size, precision = (getattr(config.eval, key) for key in HELDOUT_KEYS)
    seq_len = max_length or trained_length(config) or model.cfg.max_seq_len
    return HeldoutProtocol(split, windows, int(seq_len), batch_size, precision)


def _data_dir(config: RunConfig, run_dir) -> str:
    if not config.data.dir:
        raise ConfigError(f"{Path(run_dir) / FINAL_WEIGHTS}: the saved config has no data.dir, so the run's token shards are unknown")
    return config.data.dir


class WindowSet:
    """The held-out windows of ``stateloop eval`` (evaluate/perplexity.py: split_windows), read when
    asked for: ``windows[a:b]`` is the tensor (b - a, seq_len + 1). A shard reads only its own
    windows (the Pile's validation split, whole, would be 3 GB of int64 per job)."""

    def __init__(self, shards, seq_len: int, n: int):
        self.shards, self.seq_len, self.n = shards, seq_len, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item):
        import torch  # torch: commands/analyze.py's parser imports this module

        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("WindowSet takes a slice [a:b]")
        lo, hi, _ = item.indices(self.n)
        rows = [self.shards.window(i * self.seq_len, self.seq_len + 1) for i in range(lo, max(lo, hi))]
        if not rows:
            return torch.empty(0, self.seq_len + 1, dtype=torch.long)
        return torch.from_numpy(np.stack(rows))


def heldout_set(config: RunConfig, run_dir, split: str, seq_len: int, max_windows: int | None):
    """The held-out windows as a :class:`WindowSet`, nothing read yet. Returns (windows, shards)."""
    shards = open_split(_data_dir(config, run_dir), split)
    return WindowSet(shards, seq_len, window_count(shards, seq_len, max_windows)), shards


def weights_sha256(run_dir) -> str:
    """sha256 of the run's final weights: the trained model the shards of an analysis evaluated."""
    return sha256_file(Path(run_dir) / FINAL_WEIGHTS)


def sampled_windows(config: RunConfig, run_dir, split: str, seq_len: int, n: int | None, seed: int = CALIB_SEED):
    """``n`` windows of seq_len + 1 tokens at a seeded uniform sample (without replacement) of the
    split's non-overlapping window slots ``i * seq_len``, in increasing position: a sample spread
    over the whole split rather than its first documents. ``n`` None, or at least the number of
    slots: every slot. Returns (windows, start positions)."""
    import torch  # torch: see WindowSet

    shards = open_split(_data_dir(config, run_dir), split)
    slots = window_count(shards, seq_len)
    every = n is None or n >= slots
    picked = np.arange(slots) if every else np.sort(np.random.default_rng(seed).choice(slots, size=n, replace=False))
    starts = [int(i) * seq_len for i in picked]
    windows = torch.from_numpy(np.stack([shards.window(s, seq_len + 1) for s in starts]))
    return windows, starts


def heldout_block(protocol: HeldoutProtocol, n_windows: int, split_tokens: int, nll: float, tokens: int,
                  precision: str, matches_eval: bool) -> dict:
    """The unmodified model's held-out result, with the keys of eval.json's ``heldout`` block
    (split, windows, seq_len, tokens, split_tokens, nll, ppl), the precision it was computed at,
    and whether the settings are those of the run's ``stateloop eval`` (``matches_eval_protocol``:
    split, window cap, window length and precision; false after an overriding flag)."""
    return {"split": protocol.split, "windows": int(n_windows), "seq_len": protocol.seq_len, "tokens": int(tokens),
            "split_tokens": int(split_tokens), "nll": nll, "ppl": math.exp(nll), "precision": precision,
            "matches_eval_protocol": bool(matches_eval)}


def require_reads(model, what: str) -> None:
    """The analyses of Sec. 5 need a StateLoop model with state reads."""
    from stateloop.models.looped import StateLoopLM  # torch: not at the parser's start-up

    if not isinstance(model, StateLoopLM):
        raise ConfigError(f"model.name: {what} needs a model with a persistent state; {model.cfg.name} has none")
    if not model.has_reads:
        raise ConfigError(f"model.name: {what} needs state reads; {model.cfg.name} has none")


def log_to_mlflow(run_dir, config: RunConfig, analysis: str, metrics: dict, tags: dict, json_path,
                  curves: dict | None = None, pipeline: PipelineConfig | None = None) -> str:
    """Log an analysis into the run's MLflow run (tracking.stages.log_stage): metrics as
    ``{analysis}/<name>``, each curve ``{name: [(index, value), ...]}`` as one metric with the index
    as its step, settings as ``{analysis}.<name>`` tags (tags, unlike params, may change when an
    analysis is re-run with other settings), the JSON as an artifact under ``analysis/``."""
    return log_stage(run_dir, run_id_of(run_dir, config), config, pipeline, "analyze", analysis, metrics,
                     curves=curves, tags={f"{analysis}.{k}": v for k, v in tags.items()}, artifact=(json_path, "analysis"))
