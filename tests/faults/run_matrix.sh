#!/usr/bin/env bash
# The fault matrix: every failure the product claims to survive, as a real multi-process job on
# the CPU (mpirun, and torchrun with --max-restarts), with the fault injected through the
# product's own [faults] section. For each case it checks that the job ends or recovers by
# itself, that nothing already written is lost (metrics.jsonl holds every step once, the last
# checkpoint verifies), how many steps of work were lost and how long the recovery took, and
# whether the final state equals, bit for bit, that of an uninterrupted run (the CPU is
# deterministic). Prints a table (and writes it to $MATRIX_OUT/matrix.md); exits 1 when a case
# fails.
#
#   bash tests/faults/run_matrix.sh [path/to/vidit]
#
# A job that exits non-zero is started again with the same command, as a Slurm requeue or a
# batch loop would (docs/RELIABILITY.md); under torchrun the elastic agent restarts it itself.
set -u
VIDIT=$(realpath "${1:-build/vidit}")
WORK=${MATRIX_OUT:-$(mktemp -d /tmp/vidit-fault-matrix.XXXXXX)}
mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE SLURM_PROCID SLURM_NTASKS SLURM_LOCALID OMPI_COMM_WORLD_RANK \
  OMPI_COMM_WORLD_SIZE TORCHELASTIC_RESTART_COUNT SLURM_RESTART_COUNT
MPIRUN=$(command -v mpirun || true)
PYTHON=${PYTHON:-python3}
[ -n "$MPIRUN" ] || { echo "run_matrix: mpirun not found (apt-get install openmpi-bin)"; exit 1; }

STEPS=8
# 8 steps of a tiny model on 2 ranks (FSDP: checkpoints in two parts), a checkpoint every 2.
ARGS="train --set model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.in_channels=4 model.patch=[1,2,2]
 model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic data.latent_frames=2
 data.latent_height=4 data.latent_width=4 train.batch_size=4 train.threads=1 train.log_every=1 train.steps=$STEPS
 train.ckpt_every=2 train.keep_checkpoints=3 parallel.shard=2 train.stall_timeout_s=10"
ARGS=$(echo $ARGS)

# Each output line prefixed with the time it came ($EPOCHREALTIME), for the recovery times.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }

# launch DIR LOG LAUNCHER EXTRA...: one job; sets STATUS.
launch() {
  local dir=$1 log=$2 how=$3; shift 3
  if [ "$how" = torchrun ]; then
    timeout -k 5 240 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=2 --no-python \
      "$VIDIT" $ARGS train.out_dir="$dir" "$@" 2>&1 | stamp >"$log"
  else
    timeout -k 5 120 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$VIDIT" $ARGS train.out_dir="$dir" "$@" 2>&1 |
      stamp >"$log"
  fi
  STATUS=${PIPESTATUS[0]}
}

last_metric_step() { [ -f "$1/metrics.jsonl" ] && tail -n 1 "$1/metrics.jsonl" | sed -n 's/.*"step":\([0-9]*\).*/\1/p' || echo 0; }
final_ckpt() { printf '%s/checkpoints/step_%08d' "$1" "$STEPS"; }

echo "run_matrix: the uninterrupted run"
STRAIGHT=$WORK/straight
rm -rf "$STRAIGHT"
launch "$STRAIGHT" "$WORK/straight.log" mpi
[ "$STATUS" = 0 ] || { echo "run_matrix: the uninterrupted run failed:"; tail -20 "$WORK/straight.log"; exit 1; }

ROWS=()
FAILED=0
# run_case NAME LAUNCHER EXPECT_EQUAL "FAULTS OF ATTEMPT 1" ["FAULTS OF ATTEMPT 2" ...]
# Attempts run until one exits 0 having done every step (at most 4).
run_case() {
  local name=$1 how=$2 expect_equal=$3; shift 3
  local dir=$WORK/$name
  rm -rf "$dir"
  local faults=("$@") attempt=0 lost=0 recovery="-" note="" fault_time="" ok=yes
  local t_case=$EPOCHREALTIME
  while [ $attempt -lt 4 ]; do
    local f=${faults[$attempt]:-}
    local log=$dir.attempt$attempt.log
    mkdir -p "$dir"
    local before=$(last_metric_step "$dir")
    launch "$dir" "$log" "$how" $f
    local resumed=$(sed -n 's/^[0-9.]* resumed from step \([0-9]*\)$/\1/p' "$log" | tail -n 1)
    if [ -n "$resumed" ] && [ "$attempt" -gt 0 -o "$how" = torchrun ]; then
      # Work lost: steps done before the failure that had to be done again.
      local done_before=$before
      [ "$how" = torchrun ] &&
        done_before=$(sed '/ resumed from step /q' "$log" | sed -n 's/^[0-9.]* step *\([0-9]*\)\/.*/\1/p' | sort -n | tail -n 1)
      [ "$how" = torchrun ] && resumed=$(sed -n 's/^[0-9.]* resumed from step \([0-9]*\)$/\1/p' "$log" | head -n 1)
      lost=$((lost + done_before - resumed))
      local t_resumed=$(grep -m1 ' resumed from step ' "$log" | cut -d' ' -f1)
      [ -n "$fault_time" ] && recovery=$(awk "BEGIN { printf \"%.1f\", $t_resumed - $fault_time }")
    fi
    # When the fault (or the watchdog) spoke, for the next attempt's recovery time.
    local t_fault=$(grep -m1 -E ' (fault injection:|watchdog:)' "$log" | cut -d' ' -f1)
    [ -n "$t_fault" ] && fault_time=$t_fault
    if [ "$how" = torchrun ] && [ -n "$t_fault" ]; then
      local t_resumed=$(grep ' resumed from step ' "$log" | tail -n 1 | cut -d' ' -f1)
      [ -n "$t_resumed" ] && recovery=$(awk "BEGIN { printf \"%.1f\", $t_resumed - $t_fault }")
    fi
    attempt=$((attempt + 1))
    [ "$STATUS" = 0 ] && [ "$(last_metric_step "$dir")" = "$STEPS" ] && break
  done
  local restarts=$((attempt - 1))
  # Under torchrun the agent restarts the workers within one launch: each restart resumes.
  [ "$how" = torchrun ] && restarts=$(grep -c ' resumed from step ' "$dir.attempt0.log")
  [ "$STATUS" = 0 ] || { ok=no; note="exit $STATUS"; }
  # Nothing already written is lost: every step in metrics.jsonl once, the final checkpoint verifies.
  local steps_logged
  steps_logged=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$dir/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
  [ "$steps_logged" = "$(seq -s ' ' 1 $STEPS) " ] || { ok=no; note="$note metrics: $steps_logged"; }
  "$VIDIT" checkpoint verify "$(final_ckpt "$dir")" >"$dir.verify.log" 2>&1 || { ok=no; note="$note final checkpoint does not verify"; }
  local equal=no
  "$VIDIT" checkpoint compare "$(final_ckpt "$dir")" "$(final_ckpt "$STRAIGHT")" >"$dir.compare.log" 2>&1 && equal=yes
  if [ "$expect_equal" = yes ] && [ "$equal" != yes ]; then ok=no; note="$note not equal"; fi
  if [ "$expect_equal" = no ]; then
    [ "$equal" = no ] && note="$note differs by design" || { ok=no; note="$note equal but should differ"; }
  fi
  # The work lost per failure is at most one checkpoint interval, plus the step or so a save is
  # still being written in the background after it was taken.
  [ "$restarts" -gt 0 ] && [ "$lost" -gt $(( restarts * 3 )) ] && { ok=no; note="$note lost more than an interval"; }
  # A case that must also be diagnosed: what the first attempt must have said ($SAYS).
  if [ -n "${SAYS:-}" ]; then
    grep -qF -- "$SAYS" "$dir.attempt0.log" && note="$note said \"$SAYS\"" || { ok=no; note="$note did not say \"$SAYS\""; }
  fi
  [ "$ok" = yes ] || FAILED=1
  ROWS+=("$(printf '| %s | %s | %s | %s | %s | %s | %s | %s |' "$name" "$how" "$ok" "$restarts" "$lost" \
    "$recovery" "$equal" "$note")")
  echo "run_matrix: $name: survived $ok, restarts $restarts, lost steps $lost, recovery $recovery s, equal $equal $note"
}

run_case kill9_mid_step        mpi yes "faults.kind=kill faults.step=5 faults.rank=1"
run_case hung_rank             mpi yes "faults.kind=hang faults.step=5 faults.rank=1"
run_case kill_during_save      mpi yes "faults.kind=kill_in_save faults.step=6 faults.rank=1"
run_case disk_full_in_save     mpi yes "faults.kind=disk_full faults.step=4 faults.rank=1"
run_case io_error_in_save      mpi yes "faults.kind=io_error faults.step=4 faults.rank=0"
run_case slow_storage          mpi yes "faults.kind=slow_storage faults.step=4 faults.rank=1 faults.seconds=1"
run_case newest_corrupted      mpi yes "faults.kind=corrupt_checkpoint faults.step=6 --max-steps 6"
run_case newest_truncated      mpi yes "faults.kind=truncate_checkpoint faults.step=6 --max-steps 6"
run_case sigterm               mpi yes "faults.kind=sigterm faults.step=5 faults.rank=1"
run_case second_failure        mpi yes "faults.kind=kill faults.step=5 faults.rank=1" "faults.kind=exit faults.step=7 faults.rank=0"
run_case restart_determinism   mpi yes "--max-steps 3"
run_case torchrun_max_restarts torchrun yes "faults.kind=kill faults.step=5 faults.rank=1"
run_case nan_gradient          mpi no  "faults.kind=nan_grad faults.step=5 faults.rank=1"
# One bit of one replica's weights flips (2 replicas for this case): found before the save of
# step 6 (exit 87, both ranks named: two replicas have no majority), resumed from step 4.
SAYS="silent data corruption after step 6: rank 0 (" \
run_case sdc_bitflip           mpi yes "parallel.shard=1 parallel.replicate=2 faults.kind=bitflip faults.step=5 faults.rank=1"
# A rank whose compute is several times slower from step 2: the run completes, naming it.
SAYS="straggler: rank 1 (" \
run_case slow_rank             mpi yes "faults.kind=slow faults.step=2 faults.rank=1 faults.seconds=0.15"

# A second run on the same out_dir while the first runs (a requeued job started twice): refused,
# naming the holder; the first one goes on undisturbed.
LOCKED=$WORK/second_run_same_out_dir
rm -rf "$LOCKED" && mkdir -p "$LOCKED"
launch "$LOCKED" "$LOCKED.first.log" mpi faults.kind=slow faults.step=1 faults.rank=0 faults.seconds=1.5 &
FIRST=$!
for _ in $(seq 100); do [ -f "$LOCKED/vidit.lock" ] && break; sleep 0.1; done
launch "$LOCKED" "$LOCKED.second.log" mpi
SECOND=$STATUS
wait $FIRST
lock_ok=yes lock_note=""
[ "$SECOND" != 0 ] && grep -q 'another run is using' "$LOCKED.second.log" || { lock_ok=no; lock_note="second run not refused (exit $SECOND)"; }
lock_equal=no
"$VIDIT" checkpoint compare "$(final_ckpt "$LOCKED")" "$(final_ckpt "$STRAIGHT")" >"$LOCKED.compare.log" 2>&1 && lock_equal=yes
[ "$lock_equal" = yes ] || { lock_ok=no; lock_note="$lock_note first run disturbed"; }
[ "$lock_ok" = yes ] || FAILED=1
ROWS+=("| second_run_same_out_dir | mpi | $lock_ok | 0 | 0 | - | $lock_equal | second refused: $(grep -o 'another run is using [^ ]* ([^)]*)' "$LOCKED.second.log" | head -n 1 | sed "s|$WORK/||") $lock_note |")
echo "run_matrix: second_run_same_out_dir: survived $lock_ok"

# Slow storage did not stall training: the slow save paused it only for its snapshot; the next
# save waited for the slow one to finish (one save in flight at a time).
pause_of() { sed -n "s/.*\"blocked_s\":\([0-9.e-]*\).*\"step\":$2,.*/\1/p" "$WORK/$1/saves.jsonl"; }
SLOW_PAUSE=$(pause_of slow_storage 4)
NEXT_PAUSE=$(pause_of slow_storage 6)

{
  echo "| case | launcher | survived | restarts | lost steps | recovery s | equal to uninterrupted | notes |"
  echo "|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo
  echo "slow_storage: the slow save (step 4, 4 files at 1 s more each on rank 1) paused training ${SLOW_PAUSE} s;"
  echo "the next save (step 6) waited ${NEXT_PAUSE} s for it to finish."
} | tee "$WORK/matrix.md"
echo "run_matrix: $([ $FAILED = 0 ] && echo "every case passed" || echo "FAILED") (logs in $WORK)"
exit $FAILED
