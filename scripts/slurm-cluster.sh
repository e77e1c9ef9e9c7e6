#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, on loopback, without systemd: enough to run the
# workflow's SLURM path for real (`snakemake --profile slurm ...`) and what
# tests/workflow/test_slurm_cluster.py runs. Debian or Ubuntu, as root.
#
#   bash scripts/slurm-cluster.sh           install, configure and start (idempotent: a running,
#                                           healthy cluster with the same configuration is kept)
#   bash scripts/slurm-cluster.sh status    is it up? (exit 0 when the node takes jobs)
#   bash scripts/slurm-cluster.sh stop      stop the three daemons and remove slurm.conf (the
#                                           packages and the job state stay): with a slurm.conf
#                                           but no controller every SLURM command, and so every
#                                           `snakemake` start (the SLURM plugin asks `scontrol
#                                           show config` when it is imported), waits ~10 s
#
# What it sets up, as an example of the parts of a SLURM cluster:
#   munge       authenticates every message between commands and daemons (one shared key)
#   slurmctld   the controller: queue, scheduling, signals, requeue (state in /var/spool/slurmctld)
#   slurmd      the compute node: starts batch scripts and job steps (srun)
#   one node named after this host (NodeAddr 127.0.0.1) with this machine's CPUs and 90% of its
#   memory, in one partition `debug`; the daemons run as root and log to /var/log/slurm/.
#   Accounting is off (no slurmdbd): `sacct` has nothing to report, so Snakemake's SLURM executor
#   plugin must be told `--slurm-status-command squeue`, or it never sees a job finish.
#
# Environment: SLURM_CLUSTER_CPUS, SLURM_CLUSTER_MEM_MB override what the node offers.
#
# Then, from the repository root with .venv/bin on PATH, the smoke DAG through SLURM:
#   snakemake --profile slurm --slurm-status-command squeue --configfile configs/smoke.yaml
#   squeue; sinfo; scontrol show job <id>; scancel --signal=USR1 <id>   (the warning a job gets
#   before its time limit, sent now: training checkpoints, requeues its job and resumes)
set -euo pipefail

CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
NODE=$(hostname -s)

say() { echo "slurm-cluster: $*" >&2; }
alive() { local pid; pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return
    fi
    say "installing munge, slurmctld, slurmd, slurm-client (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    # The package scripts try to start the services and are refused without an init system: fine,
    # this script starts them.
    if ! apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client >/tmp/slurm-cluster-apt.log 2>&1; then
        apt-get update >>/tmp/slurm-cluster-apt.log 2>&1
        apt-get install -y --no-install-recommends munge slurmctld slurmd slurm-client >>/tmp/slurm-cluster-apt.log 2>&1 \
            || { say "apt-get failed: see /tmp/slurm-cluster-apt.log"; exit 1; }
    fi
}

write_config() {
    local cpus mem tmp
    # the machine's CPUs: nproc alone prints OMP_NUM_THREADS where it is set (scripts/test.sh sets 1,
    # and a node of 1 CPU leaves a 2-task job pending forever, reason PartitionConfig)
    cpus=${SLURM_CLUSTER_CPUS:-$(OMP_NUM_THREADS= OMP_THREAD_LIMIT= nproc)}
    mem=${SLURM_CLUSTER_MEM_MB:-$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)}
    mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR"
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# Written by scripts/slurm-cluster.sh: one node on loopback, accounting off.
ClusterName=stateloop
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
# No cgroups needed: processes are tracked through /proc, tasks are not bound to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
# A small cluster for tests: look at pending jobs every 5 s (default 60 s and 30 s), and let a
# requeued job start again 10 s after it stopped (AuthInfo's cred_expire, default 120 s).
SchedulerParameters=sched_interval=5,bf_interval=5
AuthInfo=cred_expire=10
# No slurmdbd: sacct reports nothing, squeue knows a finished job for MinJobAge seconds.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=600
# Jobs may be requeued (scontrol requeue, preemption); SIGKILL follows SIGTERM after KillWait.
JobRequeue=1
KillWait=10
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
    if [ -f "$CONF" ] && cmp -s "$tmp" "$CONF"; then
        rm -f "$tmp"
        return 1  # unchanged
    fi
    mv "$tmp" "$CONF"
    chmod 644 "$CONF"
    return 0
}

start_munge() {
    if alive "$MUNGE_PID"; then return; fi
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
    munge -n | unmunge >/dev/null || { say "munge does not work"; exit 1; }
}

stop_daemons() {
    local pidfile
    for pidfile in "$SLURMD_PID" "$CTLD_PID" "$MUNGE_PID"; do
        if alive "$pidfile"; then
            kill "$(cat "$pidfile")"
            for _ in $(seq 50); do alive "$pidfile" || break; sleep 0.1; done
        fi
    done
}

node_state() { sinfo -h -n "$NODE" -o %t 2>/dev/null | head -n1; }

healthy() {
    alive "$CTLD_PID" && alive "$SLURMD_PID" && case "$(node_state)" in idle* | mix* | alloc* | comp*) true ;; *) false ;; esac
}

start() {
    if [ "$(id -u)" != 0 ]; then
        healthy && { say "already up: node $NODE ($(node_state))"; return; }
        say "run as root: it installs packages, writes $CONF and starts daemons"
        exit 1
    fi
    install_packages
    local changed=0
    write_config && changed=1
    if [ $changed = 0 ] && healthy; then
        say "already up: node $NODE ($(node_state))"
        return
    fi
    [ $changed = 1 ] && stop_daemons
    start_munge
    alive "$CTLD_PID" || slurmctld
    alive "$SLURMD_PID" || slurmd
    for _ in $(seq 120); do
        case "$(node_state)" in
            idle* | mix* | alloc*) say "up: node $NODE ($(node_state)), partition debug"; return ;;
            down* | drain* | fail*) scontrol update nodename="$NODE" state=resume 2>/dev/null || true ;;
        esac
        sleep 0.5
    done
    say "the node did not come up; see $LOGDIR/slurmctld.log and $LOGDIR/slurmd.log"
    sinfo -N -l >&2 || true
    exit 1
}

case "${1:-start}" in
    start) start ;;
    stop) stop_daemons; rm -f "$CONF"; say "stopped" ;;
    status) if healthy; then say "up: node $NODE ($(node_state))"; else say "not running"; exit 1; fi ;;
    *) echo "usage: $0 [start|status|stop]" >&2; exit 2 ;;
esac
