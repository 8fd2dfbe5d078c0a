#!/usr/bin/env bash
# Preemption and requeue under real Slurm: a one-node cluster on this machine
# (tests/slurm/start_cluster.sh), the batch script users run (scripts/slurm/vidit.sbatch) with
# 2 tasks (FSDP), and the USR1 Slurm sends before a time limit (sent at once with
# `scancel --signal=USR1 --batch`, since slurmctld checks --signal only every 30 s). The job must
# save, exit 75, requeue itself, resume in attempt 1 (SLURM_RESTART_COUNT) and finish with a
# state equal, bit for bit, to an uninterrupted run of the same mesh. Then a job whose node fails
# the pre-flight checks must put the node on the exclude list and submit itself again without it,
# and so must a job whose node lost a rank without a word (train.exclude_after_crashes).
#   bash tests/slurm/run_slurm.sh [path/to/vidit]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VIDIT=$(realpath "${1:-build/vidit}")
W=${SLURM_TEST_OUT:-$(mktemp -d /tmp/vidit-slurm-test.XXXXXX)}
rm -rf "$W" && mkdir -p "$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
unset RANK WORLD_SIZE LOCAL_RANK SLURM_PROCID SLURM_NTASKS SLURM_JOB_ID SLURM_RESTART_COUNT
command -v sbatch >/dev/null || { echo "run_slurm: sbatch not found (apt-get install slurmctld slurmd slurm-client munge)"; exit 1; }

cp "$HERE/tiny.toml" "$W/tiny.toml"   # the tiny model, as a config file (sbatch --export splits on commas)
export SLURM_TRY_DIR=$W/cluster

fail() { echo "run_slurm: FAILED: $*"; [ -f "$W/job.out" ] && tail -30 "$W/job.out"; bash "$HERE/stop_cluster.sh" >/dev/null 2>&1; exit 1; }

echo "run_slurm: the uninterrupted run (mpirun)"
mpirun --oversubscribe --bind-to none -np 2 "$VIDIT" train -c "$W/tiny.toml" --set train.out_dir="$W/straight" >"$W/straight.log" 2>&1 ||
  { tail -20 "$W/straight.log"; exit 1; }

bash "$HERE/start_cluster.sh" >"$W/cluster.log" 2>&1 || { cat "$W/cluster.log"; exit 1; }
# Slow steps (0.5 s more on rank 0, in the first attempt only) leave time to preempt it.
JOB=$(cd "$ROOT" && sbatch --parsable --nodes=1 --ntasks=2 --output="$W/job.out" \
  --export=ALL,VIDIT="$VIDIT",VIDIT_HEALTH=0,VIDIT_CONFIG="$W/tiny.toml",VIDIT_SETS="train.out_dir=$W/run faults.kind=slow faults.step=1 faults.seconds=0.5" \
  scripts/slurm/vidit.sbatch) || fail "sbatch"
echo "run_slurm: job $JOB submitted"
state() { scontrol show job "$JOB" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# Preempt it once it has done 3 steps.
for _ in $(seq 600); do
  s=$(tail -n 1 "$W/run/metrics.jsonl" 2>/dev/null | sed -n 's/.*"step":\([0-9]*\).*/\1/p')
  [ -n "$s" ] && [ "$s" -ge 3 ] && break
  sleep 0.1
done
[ -n "${s:-}" ] && [ "$s" -ge 3 ] || fail "the job did not reach step 3 (state $(state))"
T0=$EPOCHREALTIME
scancel --signal=USR1 --batch "$JOB" || fail "scancel --signal"
echo "run_slurm: USR1 sent after step $s"
for _ in $(seq 900); do
  case "$(state)" in COMPLETED) break ;; FAILED|CANCELLED|TIMEOUT|NODE_FAIL) fail "job state $(state)" ;; esac
  sleep 0.2
done
[ "$(state)" = COMPLETED ] || fail "the job did not complete (state $(state))"
T1=$EPOCHREALTIME
restarts=$(scontrol show job "$JOB" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
ok=yes note=""
grep -q 'stop requested (signal 10' "$W/job.out" || { ok=no; note="$note no stop on USR1"; }
grep -q 'vidit exited with status 75' "$W/job.out" || { ok=no; note="$note first attempt did not exit 75"; }
grep -q 'attempt 1 on' "$W/job.out" || { ok=no; note="$note no attempt 1"; }
resumed=$(sed -n 's/^resumed from step \([0-9]*\)$/\1/p' "$W/job.out" | tail -n 1)
[ -n "$resumed" ] || { ok=no; note="$note did not resume"; }
steps=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$W/run/metrics.jsonl" | tr '\n' ' ')
[ "$steps" = "1 2 3 4 5 6 7 8 " ] || { ok=no; note="$note metrics: $steps"; }
equal=no
"$VIDIT" checkpoint compare "$W/run/checkpoints/step_00000008" "$W/straight/checkpoints/step_00000008" >"$W/compare.log" 2>&1 && equal=yes
[ "$equal" = yes ] || { ok=no; note="$note not equal"; }
# The pre-flight: a job whose node fails vidit health (its rank 0 computes slowly: the slow
# fault) adds the node to the exclude list and submits itself again without it; with one node,
# the new job waits, excluded from the only node.
HJOB=$(cd "$ROOT" && sbatch --parsable --nodes=1 --ntasks=2 --output="$W/health.out" \
  --export=ALL,VIDIT="$VIDIT",VIDIT_EXCLUDE="$W/exclude.txt",VIDIT_CONFIG="$W/tiny.toml",VIDIT_SETS="train.out_dir=$W/unhealthy faults.kind=slow faults.seconds=1" \
  scripts/slurm/vidit.sbatch) || fail "sbatch (health)"
# resubmitted LOG LIST TRIES: waits for the job of LOG to resubmit itself; sets NODE (the first host
# of LIST), NEXT (the new job) and EXCLUDED (yes when the new job excludes NODE).
resubmitted() {
  for _ in $(seq "$3"); do grep -q "resubmitted as job" "$1" 2>/dev/null && break; sleep 0.2; done
  NODE=$(sed -n 1p "$2" 2>/dev/null)
  NEXT=$(sed -n 's/.*resubmitted as job \([0-9]*\).*/\1/p' "$1")
  EXCLUDED=no
  [ -n "$NEXT" ] && [ -n "$NODE" ] && scontrol show job "$NEXT" | grep -q "ExcNodeList=$NODE" && EXCLUDED=yes
}
resubmitted "$W/health.out" "$W/exclude.txt" 600
node=$NODE next=$NEXT excluded=$EXCLUDED
[ -f "$W/unhealthy/metrics.jsonl" ] && { ok=no; note="$note trained on an unhealthy node"; }
[ "$excluded" = yes ] || { ok=no; note="$note unhealthy node not excluded"; cat "$W/health.out"; }
[ -n "$next" ] && scancel "$next"
# A host that loses a rank without a word: the kill fault SIGKILLs rank 1 after step 3 in the
# first attempt; with train.exclude_after_crashes = 1 the requeued attempt names the lost rank,
# puts its host on the list, does not train on it (exit 3), and the job submits itself again
# without it (the rank left behind ends by its watchdog: train.stall_min_s).
CJOB=$(cd "$ROOT" && sbatch --parsable --nodes=1 --ntasks=2 --output="$W/crash.out" \
  --export=ALL,VIDIT="$VIDIT",VIDIT_HEALTH=0,VIDIT_EXCLUDE="$W/crash_exclude.txt",VIDIT_CONFIG="$W/tiny.toml",VIDIT_SETS="train.out_dir=$W/crashing faults.kind=kill faults.step=3 faults.rank=1 train.exclude_after_crashes=1 train.stall_min_s=5 train.stall_steps=3" \
  scripts/slurm/vidit.sbatch) || fail "sbatch (crash)"
resubmitted "$W/crash.out" "$W/crash_exclude.txt" 900
cnode=$NODE cnext=$NEXT crash_excluded=$EXCLUDED
grep -q "the previous attempt lost rank 1 on $cnode" "$W/crash.out" || { crash_excluded=no; note="$note lost rank not named"; }
grep -q "attempt 1 on" "$W/crash.out" || { crash_excluded=no; note="$note no second attempt"; }
grep -q "vidit exited with status 3" "$W/crash.out" || { crash_excluded=no; note="$note attempt 1 did not refuse the host"; }
[ "$crash_excluded" = yes ] || { ok=no; note="$note crashing node not excluded"; cat "$W/crash.out"; }
[ -n "$cnext" ] && scancel "$cnext"
bash "$HERE/stop_cluster.sh" >/dev/null 2>&1
echo "| case | survived | requeues | resumed from | preempt to done s | equal to uninterrupted | notes |"
echo "|---|---|---|---|---|---|---|"
echo "| slurm_usr1_requeue | $ok | $restarts | ${resumed:-?} | $(awk "BEGIN { printf \"%.1f\", $T1 - $T0 }") | $equal | $note |"
echo "| slurm_unhealthy_node_excluded | $excluded | - | - | - | - | node $node excluded from job $next |"
echo "| slurm_crashing_node_excluded | $crash_excluded | 1 | - | - | - | node $cnode lost a rank; excluded from job $cnext |"
[ "$ok" = yes ] || { echo "run_slurm: FAILED (logs in $W)"; exit 1; }
echo "run_slurm: passed (logs in $W)"
