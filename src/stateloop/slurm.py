"""Training as a SLURM job: requeueing the job after SLURM's warning, and the CPU fallback.

SLURM sends ``--signal=USR1@N`` (N seconds before the time limit) and ``scancel --signal=USR1``
to the processes of the job's steps only, never to the batch script, where Snakemake's SLURM
executor runs the rule: the workflow therefore starts training under ``srun`` in every geometry
(workflow/rules/common.smk, ``launcher``), one task per device. The training loop checkpoints on
the signal and stops with status 75 (train/signals.py, which owns every signal). Then, inside a
SLURM job, the first task requeues the job (:func:`requeue_job`: ``scontrol requeue
$SLURM_JOB_ID``, as Lightning's SLURM auto-requeue does): SLURM stops it and later starts the
same batch script again with a fresh time limit, and the rerun resumes from the checkpoint. The
job never ends as failed or timed out, so Snakemake's ``retries`` are not spent: a run resumes as
many times as it needs. ``STATELOOP_SLURM_REQUEUE=0`` turns the requeue off (the command then
only exits with 75).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

REQUEUE_ENV = "STATELOOP_SLURM_REQUEUE"

# How early SLURM's warning before the time limit comes (``--signal=USR1@N``, the train rule's
# slurm_extra): early enough for the step in flight, the checkpoint's write and hash, and the
# requeue. The write is sized at the config's measured ``slurm.write_mb_per_s`` (pipeline.py),
# [choice] 100 MB/s where a config states none: a shared file system under load (a parallel one
# writes a stream faster; an NFS home may be slower: measure it, docs/cluster.md). The same
# measurement sets the least ``train.dist_timeout_s`` (:func:`timeout_floor`), checked with it.
CHECKPOINT_BYTES_PER_PARAM = 12  # float32 weights and AdamW's two float32 moments
CHECKPOINT_WRITE_BYTES_PER_S = 100e6
CHECKPOINT_HASH_BYTES_PER_S = 1e9  # sha256 of the written file: 9-17 s for the 1.4B runs' 17 GB
WARNING_MARGIN_S = 120  # the step in flight, the requeue, and SLURM's signal timer, which runs about once a minute
TIMEOUT_MARGIN_S = 60  # beyond the write and hash, for a collective's own wait (the ranks reach the barrier apart)


PARAMS_MARGIN = 1.25  # the estimate's margin over the shape's own count: state branches, mixers, baselines' extras


def estimated_params(model) -> int:
    """A scale's parameters from its ``model:`` shape, without building a model (planning imports
    no torch): untied embedding and head, each layer's attention and SwiGLU, plus
    :data:`PARAMS_MARGIN`. At least every run's real count in configs/paper.yaml (whose largest,
    StateLoop + Mamba-2 at 1.4B, is 3% above the shape's count), gpu.yaml and the ladders."""
    layer = 4 * model.d_model * model.n_heads * model.head_dim + 3 * model.d_model * model.d_ff
    return int(PARAMS_MARGIN * (model.n_layers * layer + 2 * model.vocab_size * model.d_model))


def checkpoint_bytes(params: int) -> int:
    """Bytes of a run's checkpoint, about (the model's parameters with AdamW's state)."""
    return CHECKPOINT_BYTES_PER_PARAM * params


def checkpoint_seconds(params: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> float:
    """Seconds rank 0 takes to write and hash the checkpoint of ``params`` parameters at
    ``write_bytes_per_s`` (the other ranks wait for it)."""
    size = checkpoint_bytes(params)
    return size / write_bytes_per_s + size / CHECKPOINT_HASH_BYTES_PER_S


def warning_seconds(params: int, runtime_min: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> int:
    """N of ``--signal=USR1@N`` for a training of ``params`` parameters whose job has a time limit
    of ``runtime_min`` minutes: the margin plus the checkpoint's write (at ``write_bytes_per_s``)
    and hash, rounded up to 10 s; a quarter of a time limit that is shorter than four times that."""
    need = WARNING_MARGIN_S + checkpoint_seconds(params, write_bytes_per_s)
    need = -(-int(need) // 10) * 10
    return max(1, min(need, runtime_min * 15))


def timeout_floor(params: int, write_bytes_per_s: float = CHECKPOINT_WRITE_BYTES_PER_S) -> int:
    """The least ``train.dist_timeout_s`` for a training of ``params`` parameters: the checkpoint's
    write (at ``write_bytes_per_s``) and hash, which the other ranks wait out at a barrier, plus
    :data:`TIMEOUT_MARGIN_S`, rounded up to 10 s."""
    need = TIMEOUT_MARGIN_S + checkpoint_seconds(params, write_bytes_per_s)
    return -(-int(need) // 10) * 10


def say(msg: str) -> None:
    print(f"stateloop train: {msg}", file=sys.stderr, flush=True)


def slurm_job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


def requeue_job(cause: str, step: int | None = None) -> bool:
    """Requeue this SLURM job (``scontrol requeue``) after ``cause`` (a signal's name) stopped
    training at ``step``; not outside a SLURM job, nor with ``STATELOOP_SLURM_REQUEUE=0``. True
    when SLURM accepted the requeue."""
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
    if accelerator != "auto" or slurm_job_id() is None:
        return
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return
    import torch

    if not torch.cuda.is_available():
        say(f"train.accelerator: auto found no GPU in SLURM job {slurm_job_id()}: training on the CPU "
            f"(set train.accelerator: cpu to mean it, or cuda to require a GPU)")

