"""A SLURM job's sizes and times, planned before it is submitted, and the config checked against
the cluster (:func:`check_cluster`): every stage's runtime within ``slurm.max_runtime``, and the
training's warning before its limit and ``train.dist_timeout_s`` sized for a checkpoint's write and
hash at ``slurm.write_mb_per_s``. The Snakefile and the commands call the check where they load a
config (pipeline.py's own check is the research code's, and knows no cluster); what runs inside a
training job (the requeue, the CPU fallback) is train/slurm.py.
"""

from __future__ import annotations

from pathlib import Path

from stateloop.config import ConfigError
from stateloop.config.pipeline import PipelineConfig
from stateloop.experiments import load_checked

# SLURM's warning (``--signal=USR1@N``) must leave time for the step in flight, the checkpoint's
# write and hash at ``slurm.write_mb_per_s`` ([choice] 100 MB/s: a loaded shared file system;
# docs/cluster.md), and the requeue; the same speed sets the least ``train.dist_timeout_s``.
CHECKPOINT_BYTES_PER_PARAM = 12  # float32 weights and AdamW's two float32 moments
CHECKPOINT_WRITE_BYTES_PER_S = 100e6
CHECKPOINT_HASH_BYTES_PER_S = 1e9  # sha256 of the written file: 9-17 s for the 1.4B runs' 17 GB
WARNING_MARGIN_S = 120  # the step in flight, the requeue, and SLURM's signal timer, which runs about once a minute
TIMEOUT_MARGIN_S = 60  # beyond the write and hash, for a collective's own wait (the ranks reach the barrier apart)
PARAMS_MARGIN = 1.25  # the estimate's margin over the shape's own count: state branches, mixers, baselines' extras


def estimated_params(model) -> int:
    """A scale's parameters from its ``model:`` shape without torch (embedding, head, attention,
    SwiGLU, plus :data:`PARAMS_MARGIN`): at least every real count in configs/ (at most +3%)."""
    layer = 4 * model.d_model * model.n_heads * model.head_dim + 3 * model.d_model * model.d_ff
    return int(PARAMS_MARGIN * (model.n_layers * layer + 2 * model.vocab_size * model.d_model))


def checkpoint_bytes(params: int) -> int:
    """Bytes of a run's checkpoint, about (the model's parameters with AdamW's state)."""
    return CHECKPOINT_BYTES_PER_PARAM * params


def checkpoint_seconds(params: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> float:
    """Seconds rank 0 takes to write and hash the checkpoint (the other ranks wait for it)."""
    size = checkpoint_bytes(params)
    return size / write_bytes_per_s + size / CHECKPOINT_HASH_BYTES_PER_S


def warning_seconds(params: int, runtime_min: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> int:
    """N of ``--signal=USR1@N``: the margin plus the checkpoint's write and hash, rounded up to
    10 s, at most a quarter of the ``runtime_min`` limit."""
    need = WARNING_MARGIN_S + checkpoint_seconds(params, write_bytes_per_s)
    need = -(-int(need) // 10) * 10
    return max(1, min(need, runtime_min * 15))


def timeout_floor(params: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> int:
    """The least ``train.dist_timeout_s``: the checkpoint's write and hash, which the other ranks
    wait out at a barrier, plus :data:`TIMEOUT_MARGIN_S`, rounded up to 10 s."""
    need = TIMEOUT_MARGIN_S + checkpoint_seconds(params, write_bytes_per_s)
    return -(-int(need) // 10) * 10


def check_cluster(cfg: PipelineConfig, where: str = "config") -> None:
    """Each scale of ``cfg`` against the cluster, one line naming the key where it does not fit: every
    stage's runtime within ``slurm.max_runtime``; the training's warning and ``train.dist_timeout_s``
    against a checkpoint's write and hash."""
    slurm = cfg.slurm
    speed = slurm.write_mb_per_s * 1e6
    for name, scale in cfg.scales.items():
        for stage in ("tokenize", "train", "eval", "analyze", "bench"):
            runtime = getattr(scale.resources, stage).runtime
            if slurm.max_runtime and runtime > slurm.max_runtime:
                raise ConfigError(
                    f"{where}: scales.{name}.resources.{stage}.runtime: {runtime} min is above slurm.max_runtime = "
                    f"{slurm.max_runtime} min, the partitions' time limit (SLURM would keep the job pending: "
                    f"PartitionTimeLimit); ask for at most {slurm.max_runtime} (a training requeues itself at its limit)")
        params = estimated_params(scale.model)
        size, save = checkpoint_bytes(params), checkpoint_seconds(params, speed)
        runtime = scale.resources.train.runtime
        lead = warning_seconds(params, runtime, speed)
        if lead < warning_seconds(params, 10**9, speed):  # capped at a quarter of the time limit
            raise ConfigError(
                f"{where}: scales.{name}.resources.train.runtime: {runtime} min is too short to save a checkpoint "
                f"before the limit: {size / 1e9:.1f} GB at slurm.write_mb_per_s = {slurm.write_mb_per_s:g} takes "
                f"{save:.0f} s, and SLURM's warning may take at most a quarter of the limit; raise the runtime")
        floor = timeout_floor(params, speed)
        if scale.train.world_size > 1 and scale.train.dist_timeout_s < floor:
            raise ConfigError(
                f"{where}: scales.{name}.train.dist_timeout_s: {scale.train.dist_timeout_s} s is shorter than rank 0's "
                f"checkpoint write and hash while the other ranks wait ({size / 1e9:.1f} GB at slurm.write_mb_per_s = "
                f"{slurm.write_mb_per_s:g}: {save:.0f} s); set it to at least {floor} (the write speed measured: docs/cluster.md)")


def check_cluster_file(path: str | Path | None) -> None:
    """:func:`check_cluster` of the config file ``path``, read as the commands read it (``load_checked``,
    once per process); None (a command given no config): nothing."""
    if path is not None:
        check_cluster(load_checked(path, expand=False)[0], str(path))
