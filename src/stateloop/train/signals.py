"""Every signal a training receives, and how it reaches the step loop.

SIGTERM, SIGUSR1 (SLURM's warning) and SIGINT set a flag (:class:`StopRequest`) that the loop
all-reduces each step; every rank checkpoints and the command exits :data:`REQUEUE_EXIT`.
:class:`SignalLog` records the signals and keeps a SIGUSR1 that comes before the loop listens.
Only SLURM's warning is requeued (:func:`requeue_after_warning`): ``scancel`` means stop, and SLURM
requeues a preempted job itself. Nothing heavy is imported: ``stateloop train`` enters SignalLog first.
"""

from __future__ import annotations

import os
import signal
import threading

from stateloop.train.slurm import requeue_job, say

REQUEUE_EXIT = 75  # EX_TEMPFAIL (sysexits.h): stopped by a signal with a complete checkpoint; rerun to resume
WARNING = signal.SIGUSR1  # what SLURM sends before the time limit (--signal=USR1@N)


def _main_thread() -> bool:
    """Signals reach the main thread only; handlers can be installed there only."""
    return threading.current_thread() is threading.main_thread()


class StopRequest:
    """SIGTERM, SIGUSR1 and Ctrl-C (SIGINT) ask for a checkpoint at the next step boundary; a
    second Ctrl-C stops at once (KeyboardInterrupt), keeping the previous checkpoint."""

    SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")

    def __init__(self):
        self.signal: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, _frame):
        name = signal.Signals(signum).name
        if name == "SIGINT" and self.signal == "SIGINT":
            raise KeyboardInterrupt
        self.signal = name
        if name == "SIGINT":
            say("Ctrl-C: writing a checkpoint at the end of this step (Ctrl-C again to stop without one)")

    def install(self) -> None:
        if hasattr(signal, "SIGUSR1") and _main_thread():
            for name in self.SIGNALS:
                sig = getattr(signal, name)
                self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class SignalLog:
    """Within ``with``: every signal number received (:attr:`received`, through
    :func:`signal.set_wakeup_fd`), and a SIGUSR1 handler that sends a caught SIGUSR1 again once
    another handler takes over. Restored on exit; nothing outside the main thread."""

    def __init__(self):
        self.received: list[int] = []
        self._early: list[int] = []
        self._active = False
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> SignalLog:
        if not _main_thread():
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
    """In the first task: requeue this SLURM job if SLURM's warning stopped training (True: accepted)."""
    return signals.got(WARNING) and requeue_job(WARNING.name, step)
