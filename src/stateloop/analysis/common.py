"""What the analyses of a trained run share: the run's model, the held-out set they evaluate on,
the calibration sample, and logging the results to MLflow next to the run's training record.

The held-out set (one protocol for Table 4 and Figure 4). The paper's analyses run "on the full
Pile validation set" and "all analyses share an unmodified baseline" with Table 4 (PPL 9.04).
So both analyses evaluate exactly the windows of ``stateloop eval``'s held-out perplexity
(evaluate/harness.py): the split ``eval.heldout_split`` (default "val") of the run's token
shards, at most ``eval.heldout_windows`` windows (null: the whole split) of ``eval.max_length``
tokens (null: the run's ``train.seq_len``), consecutive from the start of the split, in batches
of ``eval.batch_size`` at ``eval.precision``. The ``eval`` section is the one ``stateloop eval``
uses for the run (:func:`heldout_protocol`). With the reads all kept (Shapley) or no
intervention (interventions) the model is the unmodified one, so that NLL is eval.json's
``heldout.nll``: each analysis JSON records it as its ``heldout`` block, with the same keys.

The calibration sample (interventions, eq. 15) comes from a disjoint split: by default
``train``, which every data folder has and which is disjoint from the held-out split by
construction (hash-assigned documents, or separate hub splits / generator seeds), as a seeded
uniform sample of non-overlapping window slots over the whole split (:func:`sampled_windows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from stateloop.config import ConfigError
from stateloop.data.shards import ShardSet, sha256_file
from stateloop.runs import FINAL_WEIGHTS, run_id_of, trained_length
from stateloop.tracking.stages import log_stage

if TYPE_CHECKING:
    import torch

    from stateloop.pipeline import PipelineConfig, RunConfig

CALIB_SPLIT = "train"  # the split the calibration statistics come from (disjoint from any held-out split)
CALIB_WINDOWS = 64  # calibration windows, sampled over the whole calibration split
CALIB_SEED = 0


def run_seq_len(config: RunConfig, model) -> int:
    """The training context length of a run: ``train.seq_len`` of its config when present,
    else the model's ``max_seq_len``."""
    return int(trained_length(config) or model.cfg.max_seq_len)


@dataclass
class HeldoutProtocol:
    """How a run's held-out perplexity is measured (the ``eval`` section of its scale)."""

    split: str  # eval.heldout_split
    max_windows: int | None  # eval.heldout_windows (None: the whole split)
    seq_len: int  # eval.max_length, else the run's train.seq_len, else model.max_seq_len
    batch_size: int  # eval.batch_size
    precision: str  # eval.precision: "32-true" | "bf16-mixed"


# The keys of the ``eval`` section the held-out protocol reads, and so all that the analyses read of
# it (the DAG reruns them when one of these changes: workflow/rules/analysis.smk).
HELDOUT_KEYS = ("heldout_split", "heldout_windows", "max_length", "batch_size", "precision")


def heldout_protocol(config: RunConfig, model) -> HeldoutProtocol:
    """The held-out protocol of ``stateloop eval RUN_DIR [--config FILE]``: ``config.eval``, the
    run's eval section as resolve.resolve_eval resolves it (the scale's in --config's
    pipeline config; default: the pipeline config the run was trained from, when that file exists;
    else EvalConfig's defaults: split "val", the whole split)."""
    split, windows, max_length, batch_size, precision = (getattr(config.eval, key) for key in HELDOUT_KEYS)
    return HeldoutProtocol(split, windows, int(max_length or run_seq_len(config, model)), batch_size, precision)


def _data_dir(config: RunConfig, run_dir) -> str:
    if not config.data.dir:
        raise ConfigError(f"{Path(run_dir) / FINAL_WEIGHTS}: the saved config has no data.dir, so the run's token shards are unknown")
    return config.data.dir


def split_windows(config: RunConfig, run_dir, split: str, seq_len: int, max_windows: int | None):
    """Held-out windows (N, seq_len + 1) of the run's token shards (``data.dir`` of its config):
    consecutive from the start of the split, as ``stateloop eval``. Returns (windows, shards)."""
    from stateloop.evaluate.perplexity import split_windows as _split_windows  # torch: not at the parser's start-up

    return _split_windows(_data_dir(config, run_dir), split, seq_len, max_windows)


def run_windows(config: RunConfig, run_dir, split: str, seq_len: int, max_windows: int | None) -> torch.Tensor:
    """Held-out windows (N, seq_len + 1) of the run's token shards (see :func:`split_windows`)."""
    return split_windows(config, run_dir, split, seq_len, max_windows)[0]


class WindowSet:
    """The held-out windows of :func:`split_windows` read when asked for: ``len()`` windows of
    seq_len + 1 tokens, window i at token i * seq_len of the split; ``windows[a:b]`` is the tensor
    (b - a, seq_len + 1). A shard reads only its own windows (the Pile's validation split, whole,
    would be 3 GB of int64 per job)."""

    def __init__(self, shards, seq_len: int, n: int):
        self.shards, self.seq_len, self.n = shards, seq_len, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, item):
        import numpy as np
        import torch

        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("WindowSet takes a slice [a:b]")
        lo, hi, _ = item.indices(self.n)
        rows = [self.shards.window(i * self.seq_len, self.seq_len + 1) for i in range(lo, max(lo, hi))]
        if not rows:
            return torch.empty(0, self.seq_len + 1, dtype=torch.long)
        return torch.from_numpy(np.stack(rows))


def open_shards(data_dir, split: str):
    """The split's :class:`~stateloop.data.shards.ShardSet`; a missing split, a shard of the wrong size,
    dtype or checksum, or ids outside the vocabulary are one-line ConfigErrors (as in training)."""
    try:
        return ShardSet(data_dir, split)
    except KeyError as err:
        raise ConfigError(str(err.args[0])) from None
    except ValueError as err:
        raise ConfigError(str(err)) from None


def heldout_set(config: RunConfig, run_dir, split: str, seq_len: int, max_windows: int | None):
    """The windows of :func:`split_windows` (the same windows, the same one-line errors) as a
    :class:`WindowSet`, nothing read yet. Returns (windows, shards)."""

    shards = open_shards(_data_dir(config, run_dir), split)
    n = (len(shards) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    if n <= 0:
        raise ConfigError(f"{shards.dir}: split {split!r} has {len(shards)} tokens, fewer than one window of {seq_len + 1}")
    return WindowSet(shards, seq_len, n), shards


def weights_sha256(run_dir) -> str:
    """sha256 of the run's final weights: the trained model the shards of an analysis evaluated."""
    return sha256_file(Path(run_dir) / FINAL_WEIGHTS)


def sampled_windows(config: RunConfig, run_dir, split: str, seq_len: int, n: int | None, seed: int = CALIB_SEED):
    """``n`` windows of seq_len + 1 tokens at a seeded uniform sample (without replacement) of the
    split's non-overlapping window slots ``i * seq_len``, in increasing position: a sample spread
    over the whole split rather than its first documents. ``n`` None, or at least the number of
    slots: every slot. Returns (windows, start positions)."""
    import numpy as np
    import torch


    shards = open_shards(_data_dir(config, run_dir), split)
    slots = (len(shards) - 1) // seq_len
    if slots <= 0:
        raise ConfigError(f"{shards.dir}: split {split!r} has {len(shards)} tokens, fewer than one window of {seq_len + 1}")
    if n is None or n >= slots:
        picked = np.arange(slots)
    else:
        picked = np.sort(np.random.default_rng(seed).choice(slots, size=n, replace=False))
    starts = [int(i) * seq_len for i in picked]
    windows = torch.from_numpy(np.stack([shards.window(s, seq_len + 1) for s in starts]))
    return windows, starts


def heldout_block(protocol: HeldoutProtocol, n_windows: int, split_tokens: int, nll: float, tokens: int,
                  precision: str, matches_eval: bool) -> dict:
    """The unmodified model's held-out result, with the keys of eval.json's ``heldout`` block
    (split, windows, seq_len, tokens, split_tokens, nll, ppl), the precision it was computed at,
    and whether the settings are those of the run's ``stateloop eval`` (``matches_eval_protocol``:
    split, window cap, window length and precision; false after an overriding flag)."""
    import math

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
