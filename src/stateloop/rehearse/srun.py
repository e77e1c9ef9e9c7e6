"""A stand-in for SLURM's ``srun`` that starts a multi-node job step on this machine.

The train rule launches multi-node training as ``srun --nodes=N --ntasks-per-node=T
--cpus-per-task=C stateloop train ...``; on a cluster, srun starts N x T tasks and gives each the
SLURM variables Lightning Fabric's ``SLURMEnvironment`` reads. A rehearsal puts this script first
on PATH as ``srun``, so the same command line starts N x T local processes with the variables a
real job step has:

    SLURM_JOB_ID, SLURM_JOB_NAME, SLURM_NNODES, SLURM_NTASKS, SLURM_NTASKS_PER_NODE,
    SLURM_NODELIST, SLURM_CPUS_PER_TASK, SLURM_STEP_ID; per task SLURM_PROCID (global rank),
    SLURM_NODEID (node rank) and SLURM_LOCALID (rank on its node);
    MASTER_ADDR = 127.0.0.1 and MASTER_PORT = a free port (on a cluster Fabric derives them
    from SLURM_NODELIST and SLURM_JOB_ID).

Every "node" is this machine, so the processes talk over loopback (gloo on CPUs). Signals sent to
the stand-in (SIGTERM, SIGUSR1, SIGINT: SLURM's pre-timeout and preemption signals) go to every
task, as srun forwards them. The exit status is the first non-zero status in rank order, else 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


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
    codes = [proc.wait() for proc in procs]
    first = next((c for c in codes if c != 0), 0)
    return 128 - first if first < 0 else first  # killed by signal n: 128 + n, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
