"""Training as a SLURM job: the warning before the time limit, and requeueing on it.

SLURM sends ``--signal=USR1@N`` (N seconds before the time limit) and ``scancel --signal=USR1``
to the processes of the job's steps only, never to the batch script, where Snakemake's SLURM
executor runs the rule: the workflow therefore starts training under ``srun`` in every geometry
(workflow/rules/common.smk, ``launcher``), one task per device. The training loop checkpoints on
the signal and stops with status 75. Then, inside a SLURM job, the first task requeues the job
(``scontrol requeue $SLURM_JOB_ID``, as Lightning's SLURM auto-requeue does): SLURM stops it and
later starts the same batch script again with a fresh time limit, and the rerun resumes from the
checkpoint. The job never ends as failed or timed out, so Snakemake's ``retries`` are not spent:
a run resumes as many times as it needs. SIGTERM is not requeued here: ``scancel`` means stop,
the time limit itself has passed, and SLURM requeues a preempted job (``--requeue``) by itself.
``STATELOOP_SLURM_REQUEUE=0`` turns the requeue off (the command then only exits with 75).

:class:`SignalLog` records which signals the process received while training (the loop keeps
only a stop flag), and keeps a SIGUSR1 that arrives before the loop listens, which would
otherwise end the process (the default action of SIGUSR1), to hand it to the loop once it does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

REQUEUE_ENV = "STATELOOP_SLURM_REQUEUE"
WARNING = signal.SIGUSR1  # what SLURM sends before the time limit (--signal=USR1@N)


def say(msg: str) -> None:
    print(f"stateloop train: {msg}", file=sys.stderr, flush=True)


def slurm_job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID") or None


class SignalLog:
    """Within ``with``: every signal number the process receives (:attr:`received`), through
    :func:`signal.set_wakeup_fd`, whichever Python handler acts on it; and a SIGUSR1 handler
    for as long as nobody else installs one. A SIGUSR1 caught by it is sent again once another
    handler (the training loop's) takes over. Everything is restored on exit. Outside the main
    thread it does nothing (signals reach the main thread only)."""

    def __init__(self):
        self.received: list[int] = []
        self._early: list[int] = []
        self._active = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> SignalLog:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._old_handler = signal.getsignal(WARNING)
        if self._old_handler in (signal.SIG_DFL, None):
            signal.signal(WARNING, self._keep)
        self._active = True
        return self

    def _keep(self, signum, _frame) -> None:
        self._early.append(signum)
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._hand_over, name="stateloop-signal-handover", daemon=True)
            self._watcher.start()

    def _hand_over(self) -> None:
        """Wait until another handler replaces ours, then send it the kept signal."""
        while not self._stop.wait(0.05):
            current = signal.getsignal(WARNING)
            if current not in (self._keep, signal.SIG_DFL, signal.SIG_IGN, None):
                os.kill(os.getpid(), WARNING)
                return

    def __exit__(self, *exc) -> None:
        if not self._active:
            return
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=1.0)
        signal.set_wakeup_fd(self._old_fd)
        if signal.getsignal(WARNING) == self._keep:
            signal.signal(WARNING, self._old_handler)
        self.received.extend(self._drain())
        os.close(self._read)
        os.close(self._write)
        self._active = False

    def _drain(self) -> list[int]:
        out = []
        while True:
            try:
                chunk = os.read(self._read, 4096)
            except BlockingIOError:
                return out
            if not chunk:
                return out
            out.extend(chunk)

    def got(self, sig: int) -> bool:
        """Whether ``sig`` arrived (so far, while inside ``with``; all of them after it)."""
        if self._active:
            self.received.extend(self._drain())
        return sig in self.received or sig in self._early


def requeue_after_warning(signals: SignalLog, step: int | None = None) -> bool:
    """After training stopped on a signal, in the first task: requeue this SLURM job when the
    signal was SLURM's warning (SIGUSR1). True when SLURM accepted the requeue."""
    job = slurm_job_id()
    if job is None or not signals.got(WARNING) or os.environ.get(REQUEUE_ENV, "1") == "0":
        return False
    where = f" (it resumes from step {step})" if step is not None else ""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        say(f"SIGUSR1 in SLURM job {job}, but no scontrol on PATH: not requeued; rerun to resume")
        return False
    say(f"SIGUSR1 in SLURM job {job}: requeueing it (scontrol requeue {job}){where}")
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


def warn_cpu_fallback(config: dict) -> None:
    """``train.accelerator: auto`` in a SLURM job that has no GPU: one line, not silence."""
    if (config.get("train") or {}).get("accelerator") != "auto" or slurm_job_id() is None:
        return
    if os.environ.get("SLURM_PROCID", "0") != "0":
        return
    import torch

    if not torch.cuda.is_available():
        say(f"train.accelerator: auto found no GPU in SLURM job {slurm_job_id()}: training on the CPU "
            f"(set train.accelerator: cpu to mean it, or cuda to require a GPU)")
