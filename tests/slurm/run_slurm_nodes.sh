#!/usr/bin/env bash
# Slurm across nodes: a three-node cluster on this machine, each node a network namespace with its
# own hostname, address and links (tests/faults/netns_hosts.sh) running its own slurmd; slurmctld
# runs on node0. The batch script users run (scripts/slurm/vidit.sbatch) trains a two-node job,
# one task per node, FSDP over gloo (the rendezvous the script sets: MASTER_ADDR is the job's first
# host, as for NCCL on a GPU cluster). Three jobs:
#   straight  uninterrupted, the reference;
#   preempt   USR1 after step 3 (what --signal sends before a time limit): every task on both
#             nodes saves, the job exits 75, requeues itself and resumes in attempt 1;
#   node_lost the product's fault stops rank 1 (on node1) after step 3 and the script then takes
#             node1 away: its links go down and every process in its namespace (slurmd too) is
#             killed. Slurm finds the node dead and requeues the job (or the batch script does); the
#             next attempt names the rank lost on node1, puts node1 on the exclude list and
#             finishes on node0 and node2 from the newest checkpoint.
# Each must end by itself with steps 1..8 in metrics.jsonl once each and a final state equal, bit
# for bit, to the straight job's (same mesh). Prints a table.
#   bash tests/slurm/run_slurm_nodes.sh [path/to/vidit]
# Needs root, ip, unshare and Slurm (apt-get install slurmctld slurmd slurm-client munge);
# exits 77 (skipped) without namespaces.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VIDIT=$(realpath "${1:-build/vidit}")
W=${SLURM_TEST_OUT:-$(mktemp -d /tmp/vidit-slurm-nodes.XXXXXX)}
rm -rf "$W" && mkdir -p "$W"/{state,spool,log}
command -v slurmd >/dev/null || { echo "run_slurm_nodes: slurmd not found (apt-get install slurmctld slurmd slurm-client munge)"; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID SLURM_RESTART_COUNT MASTER_ADDR MASTER_PORT
# gloo, so srun needs no PMIx (whose per-step directories in /tmp the nodes of one machine would share)
export VIDIT_COMM=gloo VIDIT_SRUN_MPI=none SLURM_CONF=$W/slurm.conf
HOSTS=3
TAG=sn$$
# shellcheck source=../faults/netns_hosts.sh
source "$ROOT/tests/faults/netns_hosts.sh"
# shellcheck source=slurm_common.sh
source "$HERE/slurm_common.sh"
make_hosts || exit 77
on_ctl() { ip netns exec "$(ns 0)" "$@"; }   # Slurm's clients, run where the controller is reachable

start_munge
{
  slurm_conf_common "$W"
  cat <<CONF
SlurmctldHost=node0($(addr 0))
SlurmdSpoolDir=$W/spool/%n
SlurmdPidFile=$W/slurmd.%n.pid
SlurmdLogFile=$W/log/slurmd.%n.log
# a node that stops answering is DOWN after this many seconds (its jobs are requeued)
SlurmdTimeout=6
$(for i in $(seq 0 $((HOSTS - 1))); do slurm_node_line | sed "s/NodeName=[^ ]*/NodeName=node$i NodeAddr=$(addr "$i")/"; done)
PartitionName=debug Nodes=node[0-$((HOSTS - 1))] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
} >"$SLURM_CONF"
# `ip netns exec` mounts a fresh /sys, without the cgroup file systems slurmd initialises its
# plugins from: mount the same ones again in each node's mount namespace.
CGROUPS=$(awk '$2 ~ "^/sys/fs/cgroup" { printf "mkdir -p %s && mount -t %s -o %s %s %s && ", $2, $3, $4, $3, $2 }' /proc/self/mounts)
on_host 0 "/usr/sbin/slurmctld -c -f $SLURM_CONF"
for i in $(seq 0 $((HOSTS - 1))); do
  mkdir -p "$W/spool/node$i"
  ip netns exec "$(ns "$i")" unshare --uts sh -c "hostname node$i && $CGROUPS exec /usr/sbin/slurmd -f $SLURM_CONF"
done
fail() {
  echo "run_slurm_nodes: FAILED: $*"
  for f in "$W"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
  tail -n 5 "$W"/log/*.log
  exit 1
}
for _ in $(seq 300); do
  [ "$(on_ctl sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && [ "$(on_ctl sinfo -h -o %D)" = "$HOSTS" ] && break
  sleep 0.2
done
[ "$(on_ctl sinfo -h -o %T | sort -u)" = idle ] || { on_ctl sinfo; fail "the nodes did not come up"; }
on_ctl sinfo -N -o "%N %T %o"

cp "$HERE/tiny.toml" "$W/tiny.toml"

# submit NAME SETS: a two-node job of the batch script, its log in $W/NAME.out; prints the job id.
submit() {
  (cd "$ROOT" && on_ctl sbatch --parsable --nodes=2 --ntasks-per-node=1 --output="$W/$1.out" \
    --export=ALL,VIDIT="$VIDIT",VIDIT_HEALTH=0,VIDIT_CONFIG="$W/tiny.toml",VIDIT_EXCLUDE="$W/$1.exclude",VIDIT_MAX_REQUEUES=3,VIDIT_SETS="train.out_dir=$W/$1 $2" \
    scripts/slurm/vidit.sbatch)
}
state() { on_ctl scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# finish NAME JOB TRIES: waits until the job, or the job it resubmitted itself as, completes; sets
# LAST (that job) and DONE (yes when it completed).
finish() {
  LAST=$2 DONE=no
  for _ in $(seq "$3"); do
    next=$(sed -n 's/.*resubmitted as job \([0-9]*\).*/\1/p' "$W/$1.out" 2>/dev/null | tail -n 1)
    [ -n "$next" ] && LAST=$next
    case "$(state "$LAST")" in COMPLETED) DONE=yes; return ;; FAILED|CANCELLED|TIMEOUT) return ;; esac
    sleep 0.2
  done
}
at_step() {  # at_step NAME N: waits until metrics.jsonl has step N
  for _ in $(seq 900); do
    s=$(tail -n 1 "$W/$1/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
    [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# check NAME: every step once, and the final state equal to the straight job's; sets OK and NOTE.
check() {
  local steps
  steps=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$W/$1/metrics.jsonl" | tr '\n' ' ')
  [ "$steps" = "1 2 3 4 5 6 7 8 " ] || { OK=no; NOTE="$NOTE metrics: $steps"; }
  EQUAL=no
  "$VIDIT" checkpoint compare "$W/$1/checkpoints/step_00000008" "$W/straight/checkpoints/step_00000008" \
    >"$W/$1.compare" 2>&1 && EQUAL=yes
  [ "$EQUAL" = yes ] || { OK=no; NOTE="$NOTE not equal to straight"; }
}

JOB=$(submit straight "") || fail "sbatch straight"
finish straight "$JOB" 900
[ "$DONE" = yes ] || fail "the straight job did not complete (state $(state "$JOB"))"
hosts=$(grep -o 'on node[0-9]*, 2 tasks' "$W/straight.out" | head -n 1)
echo "run_slurm_nodes: straight job $JOB done ($hosts)"

# Preemption: slow steps in attempt 0 (0.5 s more on rank 0) leave time to send USR1 after step 3.
OK=yes NOTE=""
JOB=$(submit preempt "faults.kind=slow faults.step=1 faults.seconds=0.5") || fail "sbatch preempt"
at_step preempt 3 || fail "the preempted job did not reach step 3 (state $(state "$JOB"))"
T0=$EPOCHREALTIME
on_ctl scancel --signal=USR1 --batch "$JOB" || fail "scancel --signal"
finish preempt "$JOB" 900
T1=$EPOCHREALTIME
[ "$DONE" = yes ] || { OK=no; NOTE="$NOTE state $(state "$LAST")"; }
grep -q 'vidit exited with status 75' "$W/preempt.out" || { OK=no; NOTE="$NOTE attempt 0 did not exit 75"; }
P_STOP=$(sed -n 's/^stop requested (signal 10) after step \([0-9]*\).*/\1/p' "$W/preempt.out" | head -n 1)
[ -n "$P_STOP" ] || { OK=no; NOTE="$NOTE no stop on USR1"; }
P_RESUMED=$(sed -n 's/^resumed from step \([0-9]*\)$/\1/p' "$W/preempt.out" | tail -n 1)
[ -n "$P_RESUMED" ] || { OK=no; NOTE="$NOTE did not resume"; }
check preempt
P_OK=$OK P_NOTE=$NOTE P_EQUAL=$EQUAL P_S=$(awk "BEGIN { printf \"%.1f\", $T1 - $T0 }")
P_RESTARTS=$(on_ctl scontrol show job "$LAST" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)

# A node lost: rank 1 (node1) stops after step 3 (the product's hang fault), and node1 is then
# taken away whole, as a machine that loses power: its links go down first (no peer hears of it),
# then every process in its namespace is killed, slurmd included.
OK=yes NOTE=""
JOB=$(submit node_lost "faults.kind=hang faults.step=3 faults.rank=1 train.exclude_after_crashes=1 train.stall_min_s=5 train.stall_steps=3") ||
  fail "sbatch node_lost"
for _ in $(seq 900); do [ "$(state "$JOB")" = RUNNING ] && break; sleep 0.1; done
on_ctl scontrol show job "$JOB" | grep -q ' NodeList=node\[0-1\]' || fail "node_lost did not run on node0 and node1"
at_step node_lost 3 || fail "node_lost did not reach step 3 (state $(state "$JOB"))"
T0=$EPOCHREALTIME
for j in 0 2; do ip -n "$(ns 1)" link set "v1$j" down; done
ip netns pids "$(ns 1)" | xargs -r kill -9
echo "run_slurm_nodes: node1 taken away after step 3 of job $JOB"
finish node_lost "$JOB" 1500
T1=$EPOCHREALTIME
[ "$DONE" = yes ] || { OK=no; NOTE="$NOTE state $(state "$LAST")"; }
grep -q "the previous attempt lost rank 1 on node1" "$W/node_lost.out" || { OK=no; NOTE="$NOTE lost rank not named"; }
[ "$(cat "$W/node_lost.exclude" 2>/dev/null)" = node1 ] || { OK=no; NOTE="$NOTE node1 not (alone) on the exclude list"; }
L_HOSTS=$(on_ctl scontrol show job "$LAST" | grep -o ' NodeList=[^ ]*' | cut -d= -f2)
[ "$L_HOSTS" = "node[0,2]" ] || { OK=no; NOTE="$NOTE finished on $L_HOSTS"; }
L_RESUMED=$(sed -n 's/^resumed from step \([0-9]*\)$/\1/p' "$W/node_lost.out" | tail -n 1)
[ -n "$L_RESUMED" ] && [ "$L_RESUMED" -ge 1 ] || { OK=no; NOTE="$NOTE did not resume from a checkpoint"; }
check node_lost
L_OK=$OK L_NOTE=$NOTE L_EQUAL=$EQUAL L_S=$(awk "BEGIN { printf \"%.1f\", $T1 - $T0 }")
L_WHY=$(grep -o 'vidit exited with status [0-9]*\|DUE TO [A-Z_ ]*' "$W/node_lost.out" | head -n 2 | paste -sd' ')
grep -q "ranks that did not arrive: rank 1 (node1" "$W/node_lost.out" && L_WHY="$L_WHY, the watchdog named rank 1 on node1"

echo "| case | survived | resumed from | lost steps | fault to done s | equal to uninterrupted | notes |"
echo "|---|---|---|---|---|---|---|"
echo "| slurm_nodes_usr1_requeue | $P_OK | ${P_RESUMED:-?} | $((${P_STOP:-0} - ${P_RESUMED:-0})) | $P_S | $P_EQUAL | USR1 after step 3: stopped after step ${P_STOP:-?} on both nodes, exit 75, requeues $P_RESTARTS;$P_NOTE |"
echo "| slurm_node_lost | $L_OK | ${L_RESUMED:-?} | $((3 - ${L_RESUMED:-0})) | $L_S | $L_EQUAL | node1 gone after step 3; attempt 0: ${L_WHY:-?}; finished on $L_HOSTS (job $LAST);$L_NOTE |"
[ "$P_OK" = yes ] && [ "$L_OK" = yes ] || fail "see the table (logs in $W)"
echo "run_slurm_nodes: passed (logs in $W)"
