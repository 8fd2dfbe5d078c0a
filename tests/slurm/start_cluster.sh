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

# ---- munge ----
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none   # (or: mungekey -c)
fi
chown -R munge:munge /etc/munge; chmod 700 /etc/munge; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  # runs as the munge user (Debian's default); --force tolerates odd perms in containers
  su -s /bin/sh munge -c "/usr/sbin/munged --force" || /usr/sbin/munged --force
  for i in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n | unmunge >/dev/null

# ---- slurm.conf ----
NODELINE=$(slurmd -C | head -1)      # NodeName=<h> CPUs=.. Boards=.. ... RealMemory=..
# leave some memory headroom so slurmd never reports "low RealMemory"
MEM=$(echo "$NODELINE" | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p'); MEM=$((MEM*9/10))
NODELINE=$(echo "$NODELINE" | sed "s/RealMemory=[0-9]*/RealMemory=$MEM/")
cat > "$CONF" <<CONF
ClusterName=vidit
SlurmctldHost=$H
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
# requeued jobs wait cred_expire+1 s before they are eligible again (default 120)
AuthInfo=cred_expire=${SLURM_CRED_EXPIRE:-5}
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
# fast turnaround for tests
SchedulerType=sched/backfill
# requeued/BeginTime jobs are only picked up by the periodic schedulers (defaults 60 s and 30 s)
SchedulerParameters=sched_interval=1,bf_interval=1
MessageTimeout=10
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
OverTimeLimit=0
SlurmdTimeout=60
SlurmctldTimeout=60
$NODELINE State=UNKNOWN
# A second node that never comes up: a job that excludes this host (the pre-flight check's
# exclude list) is accepted and waits, as it would for the other nodes of a real cluster.
$(echo "$NODELINE" | sed "s/NodeName=[^ ]*/NodeName=vidit-spare NodeAddr=127.0.0.2/") State=DRAIN Reason=never-started
PartitionName=debug Nodes=$H,vidit-spare Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
# no cgroup.conf needed (no cgroup plugins used)

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
