#!/usr/bin/env bash
# A resume is a transaction, shown with real jobs (one process, and 2 ranks with FSDP under
# mpirun: checkpoints in two parts):
#  1. For each way the newest checkpoint can be bad (bytes flipped in the model, EMA or optimizer
#     file, a truncated file, a missing part, no manifest, a malformed meta.json), the run falls
#     back to the one before, sets the bad one aside, and ends bitwise equal to a run resumed
#     cleanly from that older checkpoint: nothing of the bad one survives.
#  2. What proves nothing about a checkpoint's bytes touches nothing: an I/O error, a permission
#     error or no memory while one rank maps a file (faults.kind=load_*, injected through the
#     storage interface in the job's second attempt), and a format newer than the binary. The job
#     exits 74, the checkpoint stays where it is and still verifies, and the same command, run
#     again as a requeue would, resumes from it and ends equal to an uninterrupted run.
#  3. A newest checkpoint that is corrupt with nothing older to fall back to is kept (not set
#     aside) and the run stops; an out_dir holding only checkpoints set aside is not started
#     over from step 0 (--fresh does); a crash right after the commit renamed a checkpoint into
#     place (before `latest`) loses nothing.
#
#   bash tests/faults/load_transaction.sh [path/to/vidit]
set -u
VIDIT=$(realpath "${1:-build/vidit}")
WORK=${LOAD_TEST_OUT:-$(mktemp -d /tmp/vidit-load-transaction.XXXXXX)}
rm -rf "$WORK" && mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE SLURM_PROCID SLURM_NTASKS SLURM_LOCALID OMPI_COMM_WORLD_RANK \
  OMPI_COMM_WORLD_SIZE TORCHELASTIC_RESTART_COUNT SLURM_RESTART_COUNT
MPIRUN=$(command -v mpirun || true)
[ -n "$MPIRUN" ] || { echo "load_transaction: mpirun not found (apt-get install openmpi-bin)"; exit 1; }

ARGS="train --set model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.in_channels=4 model.patch=[1,2,2]
 model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic data.latent_frames=2
 data.latent_height=4 data.latent_width=4 train.batch_size=4 train.threads=1 train.log_every=1 train.steps=8
 checkpoint.every=2 checkpoint.keep=3 train.stall_timeout_s=20"
ARGS=$(echo $ARGS)
FAILED=0
ok() { echo "load_transaction: ok: $*"; }
bad() { echo "load_transaction: FAILED: $*"; FAILED=1; }

# run MODE DIR LOG [EXTRA...]: one job (MODE 1: one process; 2: two ranks, FSDP); sets STATUS.
run() {
  local mode=$1 dir=$2 log=$3; shift 3
  if [ "$mode" = 1 ]; then
    timeout -k 5 120 "$VIDIT" $ARGS train.out_dir="$dir" parallel.shard=1 "$@" >"$log" 2>&1
  else
    timeout -k 5 120 "$MPIRUN" --oversubscribe --bind-to none -np 2 "$VIDIT" $ARGS train.out_dir="$dir" \
      parallel.shard=2 "$@" >"$log" 2>&1
  fi
  STATUS=$?
}
ckpt() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
equal() { "$VIDIT" checkpoint compare "$1" "$2" >"$3" 2>&1; }
steps_logged() { sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$1/metrics.jsonl" | tr '\n' ' '; }
# The first file of a kind in a checkpoint directory (model, ema, optimizer).
first_file() { ls "$1"/"$2".*safetensors | sort | head -n 1; }
# Overwrites 4 KiB in the middle of a file with random bytes (bit rot).
flip() { local size; size=$(stat -c %s "$1"); dd if=/dev/urandom of="$1" bs=1 count=4096 seek=$((size / 2)) conv=notrunc status=none; }

for MODE in 1 2; do
  M=$WORK/mode$MODE
  mkdir -p "$M"
  # Checkpoints at 2, 4, 6; then a clean resume from step 4 (step 6 removed) as the reference.
  run $MODE "$M/base" "$M/base.log" --max-steps 6
  [ "$STATUS" = 0 ] || { bad "mode $MODE: the base run failed (exit $STATUS)"; tail -5 "$M/base.log"; continue; }
  cp -a "$M/base" "$M/clean"
  rm -rf "$(ckpt "$M/clean" 6)"
  run $MODE "$M/clean" "$M/clean.log"
  [ "$STATUS" = 0 ] || { bad "mode $MODE: the clean resume failed (exit $STATUS)"; continue; }
  grep -q 'resumed from step 4' "$M/clean.log" || bad "mode $MODE: the clean run did not resume from step 4"
  for DAMAGE in flip_model flip_ema flip_optimizer truncate missing_part no_manifest bad_meta; do
    D=$M/$DAMAGE
    cp -a "$M/base" "$D"
    C=$(ckpt "$D" 6)
    case $DAMAGE in
      flip_model) flip "$(first_file "$C" model)" ;;
      flip_ema) flip "$(first_file "$C" ema)" ;;
      flip_optimizer) flip "$(first_file "$C" optimizer)" ;;
      truncate) f=$(first_file "$C" optimizer); truncate -s $(( $(stat -c %s "$f") / 2 )) "$f" ;;
      missing_part) rm -f "$(ls "$C"/model.*safetensors | sort | tail -n 1)" ;;
      no_manifest) rm -f "$C/manifest.json" ;;
      bad_meta) head -c 40 "$C/meta.json" >"$C/meta.json.cut" && mv "$C/meta.json.cut" "$C/meta.json" ;;
    esac
    run $MODE "$D" "$D.log"
    what="mode $MODE, $DAMAGE"
    [ "$STATUS" = 0 ] || { bad "$what: exit $STATUS"; tail -5 "$D.log"; continue; }
    grep -q "resuming from $(ckpt "$D" 4) instead" "$D.log" || bad "$what: did not fall back to step 4"
    [ -d "$C.corrupt" ] || bad "$what: the bad checkpoint was not set aside"
    [ "$(steps_logged "$D")" = "1 2 3 4 5 6 7 8 " ] || bad "$what: metrics.jsonl holds $(steps_logged "$D")"
    if equal "$(ckpt "$D" 8)" "$(ckpt "$M/clean" 8)" "$D.compare.log"; then
      ok "$what: fell back to step 4, set aside, ends bitwise equal to the clean resume"
    else
      bad "$what: differs from the clean resume: $(tail -n 3 "$D.compare.log" | tr '\n' ' ')"
    fi
  done
done

# 2. Load faults on one rank of a 2-rank job, in its second attempt (a requeue: SLURM_RESTART_COUNT).
M=$WORK/mode2
run 2 "$WORK/straight" "$WORK/straight.log"
[ "$STATUS" = 0 ] || bad "the uninterrupted run failed (exit $STATUS)"
for CASE in "load_io_error 1" "load_permission 0" "load_no_memory 1"; do
  set -- $CASE
  KIND=$1 RANK=$2 D=$WORK/$1
  cp -a "$M/base" "$D"
  FAULT="faults.kind=$KIND faults.step=6 faults.rank=$RANK faults.attempt=1"
  SLURM_RESTART_COUNT=1 run 2 "$D" "$D.attempt1.log" $FAULT
  first=$STATUS
  SLURM_RESTART_COUNT=2 run 2 "$D" "$D.attempt2.log" $FAULT
  what="$KIND on rank $RANK"
  [ "$first" = 74 ] || bad "$what: the attempt with the fault exited $first, not 74"
  grep -q 'fault injection: mapping .* fails' "$D.attempt1.log" || bad "$what: the fault did not fire"
  grep -q 'nothing was set aside' "$D.attempt1.log" || bad "$what: no 'nothing was set aside' in the error"
  [ -e "$(ckpt "$D" 6).corrupt" ] && bad "$what: a readable checkpoint was set aside"
  [ "$STATUS" = 0 ] || bad "$what: the next attempt exited $STATUS"
  grep -q 'resumed from step 6' "$D.attempt2.log" || bad "$what: the next attempt did not resume from step 6"
  [ "$(steps_logged "$D")" = "1 2 3 4 5 6 7 8 " ] || bad "$what: metrics.jsonl holds $(steps_logged "$D")"
  equal "$(ckpt "$D" 8)" "$(ckpt "$WORK/straight" 8)" "$D.compare.log" &&
    ok "$what: exit 74, nothing set aside, the requeued attempt resumed from step 6 and equals the uninterrupted run" ||
    bad "$what: not equal to the uninterrupted run"
done

# A format newer than this binary: exit 74, untouched.
D=$WORK/newer_format
cp -a "$WORK/mode1/base" "$D"
sed -i 's/"vidit-checkpoint-2"/"vidit-checkpoint-9"/' "$(ckpt "$D" 6)/meta.json"
run 1 "$D" "$D.log"
if [ "$STATUS" = 74 ] && grep -q 'written by a newer vidit' "$D.log" && [ -d "$(ckpt "$D" 6)" ] && [ ! -e "$(ckpt "$D" 6).corrupt" ]; then
  ok "newer format: exit 74, named, left in place"
else
  bad "newer format: exit $STATUS; $(grep error: "$D.log" | head -n 1)"
fi

# 3. The only checkpoint corrupt: kept, and the run stops (not step 0).
D=$WORK/only_one_corrupt
cp -a "$WORK/mode1/base" "$D"
rm -rf "$(ckpt "$D" 2)" "$(ckpt "$D" 4)"
flip "$(first_file "$(ckpt "$D" 6)" model)"
run 1 "$D" "$D.log"
if [ "$STATUS" != 0 ] && [ -d "$(ckpt "$D" 6)" ] && grep -q 'Nothing was set aside' "$D.log" && ! grep -q 'starting from step 0' "$D.log"; then
  ok "the only checkpoint corrupt: kept, the run stops (exit $STATUS)"
else
  bad "the only checkpoint corrupt: exit $STATUS; $(grep -m1 error: "$D.log")"
fi
# Only checkpoints set aside: no start from step 0 over them; --fresh does, moving them away.
mv "$(ckpt "$D" 6)" "$(ckpt "$D" 6).corrupt"
run 1 "$D" "$D.again.log"
if [ "$STATUS" != 0 ] && grep -q 'Refusing to start from step 0' "$D.again.log" && [ "$(steps_logged "$D")" = "1 2 3 4 5 6 " ]; then
  ok "only checkpoints set aside: refused to start over from step 0; metrics.jsonl untouched"
else
  bad "only checkpoints set aside: exit $STATUS, metrics $(steps_logged "$D")"
fi
run 1 "$D" "$D.fresh.log" --fresh
[ "$STATUS" = 0 ] && ls -d "$D"/previous-*/checkpoints/step_00000006.corrupt >/dev/null 2>&1 &&
  ok "--fresh starts over, the old checkpoints moved aside" || bad "--fresh: exit $STATUS"

# A crash in the commit of step 6, right after step_6.tmp became step_6 (before `latest`): the
# restart resumes from step 6 and `latest` names it again.
D=$WORK/crash_in_commit
run 2 "$D" "$D.attempt0.log" faults.kind=crash_in_commit faults.step=6 faults.rank=0
first=$STATUS
SLURM_RESTART_COUNT=1 run 2 "$D" "$D.attempt1.log" faults.kind=crash_in_commit faults.step=6 faults.rank=0
if [ "$first" != 0 ] && grep -q 'fault injection: rank kills itself (SIGKILL) in the commit' "$D.attempt0.log" &&
  [ "$STATUS" = 0 ] && grep -q 'resumed from step 6' "$D.attempt1.log" &&
  equal "$(ckpt "$D" 8)" "$(ckpt "$WORK/straight" 8)" "$D.compare.log"; then
  ok "crash in the commit: resumed from step 6, equal to the uninterrupted run"
else
  bad "crash in the commit: first exit $first, then $STATUS; $(grep -m1 'resumed from' "$D.attempt1.log")"
fi

echo "load_transaction: $([ $FAILED = 0 ] && echo "every case passed" || echo FAILED) (logs in $WORK)"
exit $FAILED
