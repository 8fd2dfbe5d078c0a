#!/bin/bash
# A one-node Slurm cluster on this machine (munged + slurmctld + slurmd, no systemd), for the
# Slurm tests of preemption and requeue (the batch script of the README run under sbatch with
# --signal and --requeue: tests/slurm/run_slurm.sh). Needs: apt-get install slurmctld
# slurmd slurm-client munge. Requeue turnaround is about 6-8 s with cred_expire=5 and
# sched_interval=1 (below); --signal=B:USR1@N is checked every 30 s, so a test sends the
# signal with `scancel --signal=USR1 --batch JOB` instead.
# Usage: start_cluster.sh   (run as root). Env: SLURM_TRY_DIR (default /tmp/vidit-slurm)
set -euo pipefail
D=${SLURM_TRY_DIR:-/tmp/vidit-slurm}
CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}  # default path: sbatch/srun/sinfo need no SLURM_CONF; else export SLURM_CONF for clients too
export SLURM_CONF=$CONF
H=$(hostname -s)
mkdir -p "$D"/{state,spool,log} "$(dirname "$CONF")"

# shellcheck source=slurm_common.sh
source "$(dirname "$0")/slurm_common.sh"
start_munge
NODELINE=$(slurm_node_line)      # NodeName=<h> CPUs=.. Boards=.. ... RealMemory=..
{
  slurm_conf_common "$D"
  cat <<CONF
SlurmctldHost=$H
SlurmdSpoolDir=$D/spool
SlurmdPidFile=$D/slurmd.pid
SlurmdLogFile=$D/log/slurmd.log
SlurmdTimeout=60
$NODELINE State=UNKNOWN
# A second node that never comes up: a job that excludes this host (the pre-flight check's
# exclude list) is accepted and waits, as it would for the other nodes of a real cluster.
$(echo "$NODELINE" | sed "s/NodeName=[^ ]*/NodeName=vidit-spare NodeAddr=127.0.0.2/") State=DRAIN Reason=never-started
PartitionName=debug Nodes=$H,vidit-spare Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
} >"$CONF"

# ---- daemons ----
# -i: ignore/skip unreadable state on start; -c would clear state (fresh cluster): use -c for tests
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld -c
pgrep -x slurmd    >/dev/null || /usr/sbin/slurmd
for i in $(seq 300); do
  st=$(sinfo -h -n "$H" -o %T 2>/dev/null || true)
  case "$st" in idle*|mixed*|allocated*) break;; esac
  # a node left DOWN by a previous run: resume it
  case "$st" in down*|drain*) scontrol update nodename="$H" state=resume 2>/dev/null || true;; esac
  sleep 0.2
done
sinfo
[ "$(sinfo -h -n "$H" -o %T)" = idle ] || { echo "node not idle"; tail -20 "$D"/log/*.log; exit 1; }
