"""A stand-in for SLURM's ``srun`` that starts a multi-node job step on this machine.

A rehearsal puts it first on PATH, so the train rule's ``srun --nodes=N --ntasks-per-node=T ...``
starts N x T local processes with the SLURM variables Lightning Fabric's ``SLURMEnvironment`` reads
(and MASTER_ADDR = 127.0.0.1, MASTER_PORT a free port); they talk over loopback (gloo). Signals
(SIGTERM, SIGUSR1, SIGINT) go to every task, as srun forwards them; the exit status is the first
non-zero one in rank order. ``--kill-on-bad-exit=1`` (``-K``) ends the step as SLURM does when a
task fails: SIGCONT and SIGTERM to the others and what they started, SIGKILL after KillWait (30 s,
or ``STATELOOP_SRUN_KILL_WAIT``), since a task blocked in a collective never runs its handler.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
KILL_WAIT_ENV = "STATELOOP_SRUN_KILL_WAIT"
KILL_WAIT_S = 30.0  # SLURM's default KillWait: SIGTERM, then SIGKILL this many seconds later


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def task_env(base: dict, nodes: int, per_node: int, cpus: int, rank: int, job_id: str, port: int) -> dict:
    env = dict(base)
    env.update({
        "SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": env.get("SLURM_JOB_NAME") or "rehearsal",
        "SLURM_NNODES": str(nodes), "SLURM_NTASKS": str(nodes * per_node), "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_NODELIST": "127.0.0.1", "SLURM_CPUS_PER_TASK": str(cpus), "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank // per_node), "SLURM_LOCALID": str(rank % per_node),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="srun", description="local stand-in for srun (stateloop rehearsals)")
    p.add_argument("--nodes", "-N", type=int, default=1)
    p.add_argument("--ntasks-per-node", type=int, default=1)
    p.add_argument("--cpus-per-task", "-c", type=int, default=1)
    p.add_argument("--kill-on-bad-exit", "-K", type=int, nargs="?", const=1, default=0, choices=(0, 1))
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if not args.command:
        p.error("no command to run")
    if args.nodes < 1 or args.ntasks_per_node < 1:
        p.error("--nodes and --ntasks-per-node must be positive")
    job_id = os.environ.get("SLURM_JOB_ID") or str(os.getpid())
    port = free_port()
    world = args.nodes * args.ntasks_per_node
    procs = [subprocess.Popen(args.command, env=task_env(os.environ, args.nodes, args.ntasks_per_node,
                                                         args.cpus_per_task, rank, job_id, port))
             for rank in range(world)]

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    failed = wait_all(procs, args.kill_on_bad_exit == 1, float(os.environ.get(KILL_WAIT_ENV, KILL_WAIT_S)))
    codes = [proc.returncode for proc in procs]
    first = failed if failed is not None else next((c for c in codes if c != 0), 0)
    return 128 - first if first < 0 else first  # killed by signal n: 128 + n, as a shell reports it


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc), parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def _signal_tree(proc: subprocess.Popen, sig: int) -> None:
    for pid in _tree(proc.pid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_all(procs: list[subprocess.Popen], kill_on_bad_exit: bool, kill_wait: float) -> int | None:
    """Wait for every task. With ``kill_on_bad_exit``, the first non-zero status ends the step: the
    other tasks get SIGCONT and SIGTERM, then SIGKILL ``kill_wait`` seconds later; returns that
    status (None: no task failed, or the option is off)."""
    if not kill_on_bad_exit:
        for proc in procs:
            proc.wait()
        return None
    failed, kill_at = None, None
    while any(proc.poll() is None for proc in procs):
        if failed is None:
            failed = next((proc.returncode for proc in procs if proc.returncode not in (None, 0)), None)
            if failed is not None:
                for proc in procs:
                    if proc.poll() is None:
                        _signal_tree(proc, signal.SIGCONT)
                        _signal_tree(proc, signal.SIGTERM)
                kill_at = time.monotonic() + kill_wait
        elif time.monotonic() >= kill_at:
            for proc in procs:
                if proc.poll() is None:
                    _signal_tree(proc, signal.SIGKILL)
            kill_at = float("inf")
        time.sleep(0.05)
    if failed is None:
        failed = next((proc.returncode for proc in procs if proc.returncode != 0), None)
    return failed


if __name__ == "__main__":
    sys.exit(main())
