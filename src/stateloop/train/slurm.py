"""Training as a SLURM job: requeueing the job after SLURM's warning, and the CPU fallback (what
runs inside the job; its sizes and times, planned before it is submitted, are ops/cluster.py's).

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

