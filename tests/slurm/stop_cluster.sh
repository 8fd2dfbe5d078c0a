#!/bin/bash
# Stop the one-node Slurm cluster started by start_cluster.sh (and munged).
D=${SLURM_TRY_DIR:-/tmp/vidit-slurm}
scancel --state=PENDING,RUNNING,SUSPENDED --full 2>/dev/null; scancel -u root 2>/dev/null
stopit() { # name pidfile
  local pid; pid=$(cat "$2" 2>/dev/null) || pid=$(pgrep -x "$1")
  [ -n "$pid" ] || return 0
  kill -TERM $pid 2>/dev/null
  for i in $(seq 100); do kill -0 $pid 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL $pid 2>/dev/null
}
stopit slurmd "$D/slurmd.pid"
# leftover slurmstepd's (job steps) from this cluster
for p in $(pgrep -x slurmstepd); do kill -KILL $p 2>/dev/null; done
stopit slurmctld "$D/slurmctld.pid"
if [ "${STOP_MUNGE:-1}" = 1 ]; then
  stopit munged /run/munge/munged.pid
fi
pgrep -a 'slurm|munged' || echo "all stopped"
