"""Training as a SLURM job: requeueing the job after SLURM's warning, and the CPU fallback.

SLURM signals only the job's steps, so the workflow starts training under ``srun``
(workflow/rules/common.smk). On the warning the loop checkpoints and exits 75 (train/signals.py),
and the first task requeues the job (``scontrol requeue``, as Lightning does): it resumes with a
fresh time limit and Snakemake's ``retries`` are never spent. ``STATELOOP_SLURM_REQUEUE=0``: no requeue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

REQUEUE_ENV = "STATELOOP_SLURM_REQUEUE"

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


def say(msg: str) -> None:
    print(f"stateloop train: {msg}", file=sys.stderr, flush=True)


def slurm_job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


def requeue_job(cause: str, step: int | None = None) -> bool:
    """Requeue this SLURM job after ``cause`` (a signal's name) stopped training at ``step``
    (unless STATELOOP_SLURM_REQUEUE=0); True when SLURM accepted it."""
    job = slurm_job_id()
    if job is None or os.environ.get(REQUEUE_ENV, "1") == "0":
        return False
    where = f" (it resumes from step {step})" if step is not None else ""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        say(f"{cause} in SLURM job {job}, but no scontrol on PATH: not requeued; rerun to resume")
        return False
    say(f"{cause} in SLURM job {job}: requeueing it (scontrol requeue {job}){where}")
    # SLURM stops every process of the job as soon as it accepts the requeue: let the lines
    # above reach the job's log first (srun relays them to the batch script's output).
    time.sleep(1.0)
    try:
        proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        say(f"scontrol requeue {job} failed ({err}): not requeued; rerun to resume")
        return False
    if proc.returncode != 0:
        reason = (proc.stderr or proc.stdout).strip().splitlines()
        say(f"scontrol requeue {job} failed ({reason[-1] if reason else proc.returncode}): not requeued "
            f"(is the job requeueable? sbatch --requeue); rerun to resume")
        return False
    return True


def warn_cpu_fallback(accelerator: str) -> None:
    """``train.accelerator: auto`` in a SLURM job that has no GPU: one line, not silence."""
    if accelerator != "auto" or slurm_job_id() is None or os.environ.get("SLURM_PROCID", "0") != "0":
        return
    import torch

    if not torch.cuda.is_available():
        say(f"train.accelerator: auto found no GPU in SLURM job {slurm_job_id()}: training on the CPU "
            f"(set train.accelerator: cpu to mean it, or cuda to require a GPU)")

