#!/usr/bin/env bash
# The fault matrix: every failure the product claims to survive, as a real multi-process job on
# the CPU (mpirun, and torchrun with --max-restarts), the fault injected through the product's
# own [faults] section or, where one job meets two failures, delivered from outside as a
# scheduler or a dying node would. A case passes only when everything it claims is seen:
#  - the fault fired: its own message ("fault injection: ...", or the product's or the launcher's
#    named message), on the named rank, in the named attempt, and in no other attempt;
#  - the exit status of every attempt is the one expected (so is the restart count); a case the
#    docs say trains on through its fault (a failed save, slow storage, a NaN, a straggler)
#    finishes in one attempt with exit 0;
#  - nothing already written is lost: metrics.jsonl holds steps 1..STEPS exactly once, the final
#    checkpoint verifies (`vidit checkpoint verify`), no attempt after the first starts from
#    step 0;
#  - the steps lost: for every attempt after the first, the last step metrics.jsonl held before
#    it started less the step it resumed from; at most one checkpoint interval plus a step per
#    failure (two intervals where the newest checkpoint is bad and the one before is used);
#  - the recovery time: from the first message of a failure (the fault's, the watchdog's, the
#    harness's) to the "resumed from step" line of the attempt that resumes next, within a bound;
#  - the final state (weights, EMA, AdamW moments, RNG) equals, bit for bit, that of an
#    uninterrupted run with the same mesh (`vidit checkpoint compare`; the CPU is
#    deterministic), or differs where the case changes training by design.
#
#   bash tests/faults/run_matrix.sh [path/to/vidit]          # MATRIX_OUT=dir keeps the logs there
#
# Prints a table (also written to $MATRIX_OUT/matrix.md); exits 1 when a case fails.
#
# Restarts: a job that exits non-zero is started again with exactly the same command line, as a
# Slurm requeue or a batch loop would (docs/RELIABILITY.md). Attempts differ only in the
# environment a launcher sets, SLURM_RESTART_COUNT=<attempt>, which the product reads (a fault
# fires only in attempt faults.attempt). Under torchrun the elastic agent restarts the workers
# itself (TORCHELASTIC_RESTART_COUNT).
#
# Failures from outside: a job's [faults] section holds one fault. A case that needs a second
# failure in the same job (a node dying before the restart meets a storage error) delivers it
# as the world would, by signals to the job's processes: SIGKILL to one rank (a node lost) or
# SIGTERM to every rank (a scheduler's preemption, as Slurm signals every task). These tiny jobs
# train 8 steps in well under a second, far too fast to place a signal by watching the logs, so
# the harness paces rank 1 (`pace`: SIGSTOP, then SIGCONT for 10 ms at a time) until a condition
# on disk holds (say, the checkpoint of step 4 is committed). Rank 1 is then stopped, so the job
# cannot pass its next collective, and the signal lands there: the other rank can still finish
# its step, and rank 0 commit a save whose parts are all written, nothing more.
# Between attempts the harness changes the out_dir as the world does while no job runs: a
# checkpoint rots (bytes overwritten, a file cut short), loses its manifest, or says it was
# written by a newer vidit. (The product's own corrupt_checkpoint and truncate_checkpoint faults
# damage a checkpoint when its save is reported, which can be after the next checkpoint is
# committed: no signal from outside could then end the job between the two, so the newest_*
# cases end attempt 0 with the product's kill after step 7, which commits step 6 first, and rot
# step 6 between the attempts.)
set -u
VIDIT=$(realpath "${1:-build/vidit}")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${MATRIX_OUT:-$(mktemp -d /tmp/vidit-fault-matrix.XXXXXX)}
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE SLURM_PROCID SLURM_NTASKS SLURM_LOCALID OMPI_COMM_WORLD_RANK \
  OMPI_COMM_WORLD_SIZE TORCHELASTIC_RESTART_COUNT SLURM_RESTART_COUNT SLURM_JOB_ID
MPIRUN=$(command -v mpirun || true)
[ -n "$MPIRUN" ] || { echo "run_matrix: mpirun not found (apt-get install openmpi-bin)"; exit 1; }
# torchrun needs a Python with torch: $PYTHON, else python3, else the repository's .venv.
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for p in python3 "$ROOT/.venv/bin/python"; do
    "$p" -c 'import torch' >/dev/null 2>&1 && { PYTHON=$p; break; }
  done
fi

STEPS=8
EVERY=2  # checkpoint.every
# 8 steps of a tiny model on 2 ranks (FSDP: checkpoints in two parts), a checkpoint every 2.
ARGS="train --set model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.in_channels=4 model.patch=[1,2,2]
 model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic data.latent_frames=2
 data.latent_height=4 data.latent_width=4 train.batch_size=4 train.threads=1 train.log_every=1 train.steps=$STEPS
 checkpoint.every=$EVERY checkpoint.keep=3 parallel.shard=2 train.stall_timeout_s=10"
ARGS=$(echo $ARGS)
ATTEMPT_LIMIT_S=120  # one attempt's wall-clock limit (timeout)

# Each output line prefixed with the time it came ($EPOCHREALTIME). Under mpirun --tag-output a
# rank's line reads "<time> [<job>,<rank>]<stdout|stderr>:<text>"; the launcher's own and the
# harness's lines have no tag.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done; }
# A line of the harness in a log, stamped.
note_in() { printf '%s harness: %s\n' "$EPOCHREALTIME" "$2" >>"$1"; }
# The lines rank R said (R = * for any rank), the tag stripped: "<time> <text>".
said() {
  local r=$2
  [ "$r" = "*" ] && r='[0-9]+'
  sed -En "s/^([0-9.]+) \[[0-9]+,$r\]<std(out|err)>:/\1 /p" "$1"
}
escape_re() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|/]/\\&/g'; }
last_metric_step() {
  local s=""
  [ -f "$1/metrics.jsonl" ] && s=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$1/metrics.jsonl" | tail -n 1)
  echo "${s:-0}"
}
ckpt_dir() { printf '%s/checkpoints/step_%08d' "$1" "$2"; }
final_ckpt() { ckpt_dir "$1" "$STEPS"; }
# The newest committed checkpoint in an out_dir (not .tmp, .corrupt, .old), or nothing.
newest_ckpt() { ls -d "$1"/checkpoints/step_* 2>/dev/null | grep -E '/step_[0-9]{8}$' | sort | tail -n 1; }
step_of() { basename "$1" | sed 's/^step_0*//; s/^$/0/'; }

# The pid of rank R's vidit process of the job whose out_dir is DIR (mpirun and timeout carry
# the same arguments but not the rank's environment), or nothing.
rank_pid() {
  local p pat="train\\.out_dir=$(escape_re "$1")( |\$)"
  for p in $(pgrep -f -- "$pat"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
}
# pace DIR RANK COND: holds rank RANK of the job in DIR (started or starting) to slices of 10 ms
# of running, checking the shell test COND between slices, until it holds. Returns 0 with the
# rank stopped (SIGSTOP) and its pid in PACED; 1 when the rank ended first (or 60 s passed).
pace() {
  local dir=$1 rank=$2 cond=$3 pid="" until=$((SECONDS + 60))
  PACED=""
  while pid=$(rank_pid "$dir" "$rank"); [ -z "$pid" ]; do
    [ $SECONDS -lt $until ] || return 1
    sleep 0.01
  done
  kill -STOP "$pid" 2>/dev/null || return 1
  while ! eval "$cond"; do
    [ $SECONDS -lt $until ] || { kill -CONT "$pid" 2>/dev/null; return 1; }
    kill -CONT "$pid" 2>/dev/null || return 1
    sleep 0.01
    kill -STOP "$pid" 2>/dev/null || return 1
  done
  PACED=$pid
}

# The command of a case: the same in every attempt. Sets CMD (an array).
make_cmd() {  # DIR LAUNCHER EXTRA_ARGS
  if [ "$2" = torchrun ]; then
    CMD=(timeout -k 5 240 "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=2 --tee 3
         --log-dir "$1.torchrun-logs" --no-python "$VIDIT" $ARGS train.out_dir="$1" $3)
  else
    CMD=(timeout -k 5 "$ATTEMPT_LIMIT_S" "$MPIRUN" --tag-output --oversubscribe --bind-to none -np 2
         "$VIDIT" $ARGS train.out_dir="$1" $3)
  fi
}
# start_attempt LOG ATTEMPT: starts ${CMD[@]} in the background as attempt ATTEMPT of its job;
# wait_attempt then sets STATUS.
start_attempt() {
  local log=$1 attempt=$2
  rm -f "$log.status"
  printf '%s harness: attempt %s: SLURM_RESTART_COUNT=%s %s\n' "$EPOCHREALTIME" "$attempt" "$attempt" "${CMD[*]}" >>"$log"
  { SLURM_RESTART_COUNT=$attempt "${CMD[@]}" 2>&1; echo $? >"$log.status"; } | stamp >>"$log" &
  ATTEMPT_PID=$!
}
wait_attempt() {
  wait "$ATTEMPT_PID"
  STATUS=$(cat "$1.status" 2>/dev/null || echo "?")
}

# Reference runs, uninterrupted, one per mesh (the extra arguments a case gives them). Sets REF
# to its out_dir; empty when it failed.
declare -A REFERENCE=()
reference() {  # MESH_ARGS
  local key=${1:-default}
  if [ -z "${REFERENCE[$key]:-}" ]; then
    local dir=$WORK/straight${1:+_$(echo "$1" | tr -c 'a-z0-9\n' '_')}
    rm -rf "$dir" "$dir.log"
    make_cmd "$dir" mpi "$1"
    start_attempt "$dir.log" 0
    wait_attempt "$dir.log"
    if [ "$STATUS" != 0 ]; then
      echo "run_matrix: the uninterrupted run ($key) failed (exit $STATUS):" >&2
      tail -n 20 "$dir.log" >&2
      REFERENCE[$key]=FAILED
    else
      REFERENCE[$key]=$dir
    fi
  fi
  REF=${REFERENCE[$key]}
  [ "$REF" != FAILED ] || REF=""
}

echo "run_matrix: the uninterrupted run"
reference ""
STRAIGHT=$REF
[ -n "$STRAIGHT" ] || exit 1
T_MATRIX=$SECONDS

ROWS=()
FAILED=0
# MATRIX_CASES="name ...": only those cases (to work on some; the table then has only them).
wanted() { [ -z "${MATRIX_CASES:-}" ] || [[ " $MATRIX_CASES " == *" $1 "* ]]; }
# A case's state, for its hooks: its out_dir, the log of attempt N ($DIR.attemptN.log), and
# what a hook found wrong (bad "...") or wants in the notes (NOTES).
DIR="" CASE_OK=yes NOTES=""
bad() { CASE_OK=no; NOTES="$NOTES; $*"; }
add_note() { NOTES="$NOTES; $*"; }
log_of() { echo "$DIR.attempt$1.log"; }

# run_case NAME [options]: one case (see the cases below for examples).
#   --launcher mpi|torchrun   (mpi)
#   --args "K=V ..."          settings added to the command line (the same in every attempt)
#   --mesh "K=V ..."          mesh settings: added too, and the reference run has them
#   --exits "137,0"           the exit status of each attempt; so also the number of attempts
#   --fired "A R REGEX"       attempt A's log has a line of rank R (* any; - untagged: the
#                             launcher's or the harness's) matching REGEX (extended, anchored at
#                             the text's start); may be given more than once
#   --says "A R REGEX"        the same, for what the product must say about the fault
#   --resumes "A STEP"        attempt A resumed from step STEP
#   --lost N                  most steps lost in all (default: (EVERY + 1) per failure)
#   --bound S                 most seconds a recovery may take (default 30)
#   --equal yes|no            the final state equals the reference's (default yes)
#   --outside FUNC            run while each attempt runs: FUNC ATTEMPT (it acts in the attempts it
#                             chooses and returns; the attempt is then waited for)
#   --before FUNC             run before attempt 0, in the new out_dir
#   --between FUNC            run before each attempt after the first: FUNC ATTEMPT
#   --check FUNC              run after the last attempt: more checks (bad / add_note)
#   --note "text"             for the table
run_case() {
  local name=$1; shift
  wanted "$name" || return 0
  local how=mpi args="" mesh="" exits="0" lost_max="" bound=30 expect_equal=yes before="" outside="" between="" check=""
  local note=""
  local -a fired=() says=() resumes=()
  while [ $# -gt 0 ]; do
    case $1 in
      --launcher) how=$2 ;;
      --args) args=$2 ;;
      --mesh) mesh=$2 ;;
      --exits) exits=$2 ;;
      --fired) fired+=("$2") ;;
      --says) says+=("$2") ;;
      --resumes) resumes+=("$2") ;;
      --lost) lost_max=$2 ;;
      --bound) bound=$2 ;;
      --equal) expect_equal=$2 ;;
      --outside) outside=$2 ;;
      --before) before=$2 ;;
      --between) between=$2 ;;
      --check) check=$2 ;;
      --note) note=$2 ;;
      *) echo "run_matrix: $name: unknown option $1" >&2; exit 2 ;;
    esac
    shift 2
  done
  DIR=$WORK/$name CASE_OK=yes NOTES=""
  rm -rf "$DIR" "$DIR".attempt*.log* "$DIR".torchrun-logs
  mkdir -p "$DIR"
  if [ "$how" = torchrun ] && [ -z "$PYTHON" ]; then
    FAILED=1
    ROWS+=("| $name | torchrun | no | - | - | - | - | - | - | - | no Python with torch for torchrun: set PYTHON |")
    echo "run_matrix: $name: FAILED: no Python with torch for torchrun (set PYTHON)"
    return
  fi
  reference "$mesh"
  local ref=$REF
  [ -n "$before" ] && "$before"
  make_cmd "$DIR" "$how" "$mesh${mesh:+ }$args"
  local -a expected=(${exits//,/ })
  local max_attempts=$(( ${#expected[@]} + 1 ))  # one more than expected, to show what happens
  local -a statuses=() last_before=()
  local attempt=0
  [ "$how" = torchrun ] && max_attempts=1  # the agent restarts the workers within one launch
  while [ $attempt -lt $max_attempts ]; do
    local log; log=$(log_of $attempt)
    [ $attempt -gt 0 ] && [ -n "$between" ] && "$between" $attempt
    last_before[$attempt]=$(last_metric_step "$DIR")
    start_attempt "$log" $attempt
    [ -n "$outside" ] && "$outside" $attempt
    wait_attempt "$log"
    statuses+=("$STATUS")
    attempt=$((attempt + 1))
    [ "$STATUS" = 0 ] && break
  done
  local attempts=$attempt

  # Under torchrun, one launch holds every attempt: the agent's log names each failed worker
  # group's exit code (-N: killed by signal N, shown as 128+N).
  if [ "$how" = torchrun ]; then
    local log0; log0=$(log_of 0)
    statuses=($(sed -nE 's/.*failed \(exitcode: (-?[0-9]+)\).*/\1/p' "$log0" |
      awk '{ print ($1 < 0 ? 128 - $1 : $1) }') "$STATUS")
    attempts=$(grep -cE '^[0-9.]+ \[default0\]:vidit train: resolved config' "$log0")
  fi
  # Every attempt ran the same command line (its log says which).
  local cmds; cmds=$(for ((a = 0; a < attempt; a++)); do
    grep -m1 '^[0-9.]* harness: attempt [0-9]*: ' "$(log_of $a)" | sed 's/^[0-9.]* harness: attempt [0-9]*: SLURM_RESTART_COUNT=[0-9]* //'
    done | sort -u | wc -l)
  [ "$cmds" = 1 ] || bad "the attempts ran $cmds different command lines"
  local got_exits; got_exits=$(IFS=,; echo "${statuses[*]}")
  [ "$got_exits" = "$exits" ] || bad "exit statuses $got_exits, expected $exits"
  local restarts=$((attempts - 1))

  # The fault fired: each expected message, on its rank, in its attempt...
  local fired_ok=yes spec a r re text
  local -a fault_attempts=()
  for spec in ${fired[@]+"${fired[@]}"}; do
    read -r a r re <<<"$spec"
    if ! said_in "$how" "$a" "$r" "$re"; then
      fired_ok=no
      bad "did not fire: attempt $a, rank $r: $re"
    fi
    [[ $re == *"fault injection"* ]] && fault_attempts+=("$a")
  done
  [ ${#fired[@]} -gt 0 ] || fired_ok="-"
  # ...and an injected fault in no other attempt (faults.attempt); under torchrun, where one log
  # holds every attempt, no more often than expected.
  if [ "$how" = torchrun ]; then
    local n; n=$(grep -cE '^[0-9.]+ \[default[0-9]+\]:fault injection:' "$(log_of 0)")
    [ "$n" -le ${#fault_attempts[@]} ] || { fired_ok=no; bad "a fault fired $n times"; }
  else
    for ((a = 0; a < attempts; a++)); do
      [[ " ${fault_attempts[*]-} " == *" $a "* ]] && continue
      if said "$(log_of $a)" '*' | grep -q '^[0-9.]* fault injection:'; then
        fired_ok=no
        bad "a fault fired in attempt $a too: $(said "$(log_of $a)" '*' | grep -m1 ' fault injection:' | cut -d' ' -f2-)"
      fi
    done
  fi
  for spec in ${says[@]+"${says[@]}"}; do
    read -r a r re <<<"$spec"
    said_in "$how" "$a" "$r" "$re" || bad "attempt $a did not say: $re"
  done

  # Lost steps and recovery times, per attempt after the first.
  local lost=0 recovery=() failures=0 resumed_in=()
  if [ "$how" = torchrun ]; then
    # One log: the console's step lines before each resume, and the resumes.
    local log0; log0=$(log_of 0)
    local prev_fault="" last=0 line t
    while IFS= read -r line; do
      t=${line%% *}
      text=${line#* }
      case $text in
        "[default0]:step "*)
          local s; s=$(echo "$text" | sed -nE 's/^\[default0\]:step +([0-9]+)\/.*/\1/p')
          [ -n "$s" ] && [ "$s" -gt "$last" ] && last=$s ;;
        "[default"[0-9]"]:fault injection:"*|"[default"[0-9]"]:watchdog:"*)
          [ -z "$prev_fault" ] && prev_fault=$t ;;
        "[default0]:resumed from step "*)
          local from=${text##* }
          lost=$((lost + last - from)); last=$from; failures=$((failures + 1))
          [ -n "$prev_fault" ] && recovery+=("$(awk "BEGIN { printf \"%.1f\", $t - $prev_fault }")")
          prev_fault="" ;;
        "[default0]:no checkpoint in "*"starting from step 0"*)
          [ "$last" -gt 0 ] && bad "a restart started from step 0" ;;
      esac
    done <"$log0"
  else
    for ((a = 1; a < attempts; a++)); do
      local log; log=$(log_of $a)
      [ "${statuses[$((a - 1))]}" != 0 ] && failures=$((failures + 1))
      if said "$log" 0 | grep -q '^[0-9.]* no checkpoint in .*starting from step 0'; then
        bad "attempt $a started from step 0 (after ${last_before[$a]} steps logged)"
        lost=$((lost + ${last_before[$a]}))
        continue
      fi
      local from; from=$(said "$log" 0 | sed -n 's/^[0-9.]* resumed from step \([0-9]*\)$/\1/p' | head -n 1)
      [ -n "$from" ] || continue  # failed before it could resume (its exit status tells)
      resumed_in[$a]=$from
      lost=$((lost + ${last_before[$a]} - from))
    done
    # Recovery: from the first message of each failed attempt to the next resume.
    for ((a = 0; a + 1 < attempts; a++)); do
      [ "${statuses[$a]}" != 0 ] || continue
      local log; log=$(log_of $a)
      local t_fault
      t_fault=$(grep -m1 -E '^[0-9.]+ (\[[0-9]+,[0-9]+\]<std(out|err)>:)?(fault injection:|watchdog:|harness: (SIGKILL|SIGTERM|set|removed|flipped|truncated)|error:)' "$log" | cut -d' ' -f1)
      [ -n "$t_fault" ] || t_fault=$(tail -n 1 "$log" | cut -d' ' -f1)
      local b t_res=""
      for ((b = a + 1; b < attempts; b++)); do
        [ -n "${resumed_in[$b]:-}" ] || continue
        t_res=$(said "$(log_of $b)" 0 | grep -m1 ' resumed from step ' | cut -d' ' -f1)
        break
      done
      [ -n "$t_res" ] && recovery+=("$(awk "BEGIN { printf \"%.1f\", $t_res - $t_fault }")")
    done
  fi
  for spec in ${resumes[@]+"${resumes[@]}"}; do
    read -r a s <<<"$spec"
    if [ "$how" = torchrun ]; then
      grep -qE "^[0-9.]+ \[default0\]:resumed from step $s\$" "$(log_of 0)" || bad "did not resume from step $s"
    else
      [ "${resumed_in[$a]:-}" = "$s" ] || bad "attempt $a resumed from step ${resumed_in[$a]:-none}, expected $s"
    fi
  done
  [ -n "$lost_max" ] || lost_max=$(( failures * (EVERY + 1) ))
  [ "$lost" -le "$lost_max" ] || bad "lost $lost steps (at most $lost_max)"
  local rec
  for rec in ${recovery[@]+"${recovery[@]}"}; do
    awk "BEGIN { exit !($rec > $bound) }" && bad "a recovery took $rec s (bound $bound s)"
  done
  [ "$failures" -eq 0 ] || [ ${#recovery[@]} -gt 0 ] || bad "no resume after the failure"

  # Nothing already written is lost: every step in metrics.jsonl once, the final checkpoint verifies.
  local steps_logged
  steps_logged=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$DIR/metrics.jsonl" 2>/dev/null | tr '\n' ' ')
  [ "$steps_logged" = "$(seq -s ' ' 1 $STEPS) " ] || bad "metrics.jsonl holds steps: ${steps_logged:-none}"
  "$VIDIT" checkpoint verify "$(final_ckpt "$DIR")" >"$DIR.verify.log" 2>&1 || bad "the final checkpoint does not verify"
  local equal=no
  "$VIDIT" checkpoint compare "$(final_ckpt "$DIR")" "$(final_ckpt "$ref")" >"$DIR.compare.log" 2>&1 && equal=yes
  if [ "$expect_equal" = yes ] && [ "$equal" != yes ]; then bad "not equal to the uninterrupted run"; fi
  if [ "$expect_equal" = no ]; then
    [ "$equal" = no ] && add_note "differs by design" || bad "equal but should differ"
  fi
  [ -n "$check" ] && "$check"

  [ "$CASE_OK" = yes ] || FAILED=1
  local rec_text; rec_text=$(IFS=,; echo "${recovery[*]-}")
  local notes="$note${NOTES}"
  notes=${notes#; }
  notes=${notes//$WORK\//}
  ROWS+=("$(printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' "$name" "$how" "$CASE_OK" "$got_exits" \
    "$restarts" "$fired_ok" "$lost" "${rec_text:--}" "$bound" "$equal" "$notes")")
  echo "run_matrix: $name: passed $CASE_OK, exits $got_exits (expected $exits), fired $fired_ok, lost $lost," \
    "recovery ${rec_text:--} s (bound $bound), equal $equal${NOTES:+ $NOTES}"
}

# said_in LAUNCHER ATTEMPT RANK REGEX: the attempt's log has such a line.
said_in() {
  local how=$1 a=$2 r=$3 re=$4 log
  log=$(log_of "$a")
  [ "$how" = torchrun ] && log=$(log_of 0)
  if [ "$r" = "-" ]; then
    grep -qE "^[0-9.]+ $re" "$log"
  elif [ "$how" = torchrun ]; then
    [ "$r" = "*" ] && r='[0-9]+'
    grep -qE "^[0-9.]+ \[default$r\]:$re" "$log"
  else
    said "$log" "$r" | grep -qE "^[0-9.]+ $re"
  fi
}

# ---- what the harness does from outside ---------------------------------------------------

# A node lost: in attempt 0, once the checkpoint of step 4 is committed, rank 1 is SIGKILLed.
kill_rank1_after_ckpt4() {
  [ "$1" = 0 ] || return 0
  local log; log=$(log_of 0)
  if pace "$DIR" 1 "[ -d '$(ckpt_dir "$DIR" 4)' ]"; then
    note_in "$log" "SIGKILL to rank 1 (pid $PACED): a node lost, $(basename "$(newest_ckpt "$DIR")") committed, metrics at step $(last_metric_step "$DIR")"
    kill -KILL "$PACED"
  else
    note_in "$log" "could not stop rank 1 after the checkpoint of step 4 (the attempt ended first)"
  fi
}

# A preemption: in attempt 0, once the checkpoint of step 2 is committed, SIGTERM to every rank
# (a scheduler signals every task of the job).
preempt_after_ckpt2() {
  [ "$1" = 0 ] || return 0
  local log; log=$(log_of 0)
  if pace "$DIR" 1 "[ -d '$(ckpt_dir "$DIR" 2)' ]"; then
    local r0; r0=$(rank_pid "$DIR" 0)
    note_in "$log" "SIGTERM to every rank (pids ${r0:-?} $PACED): preempted, metrics at step $(last_metric_step "$DIR")"
    [ -n "$r0" ] && kill -TERM "$r0"
    kill -TERM "$PACED"
    kill -CONT "$PACED"
  else
    note_in "$log" "could not stop rank 1 after the checkpoint of step 2 (the attempt ended first)"
  fi
}

# Before attempt 1 of the newest_* cases: the newest checkpoint (step 6, committed before the
# kill after step 7) rots on disk while no job runs: 4 KiB in the middle of its first model part
# overwritten, or that file cut to half its size (what the product's corrupt_checkpoint and
# truncate_checkpoint faults do, but those act when the save is reported, which can come after
# the next checkpoint is committed: no signal from outside could end the job between the two).
damage_between() {  # ATTEMPT flip|truncate
  [ "$1" = 1 ] || return 0
  local newest; newest=$(newest_ckpt "$DIR")
  [ "$newest" = "$(ckpt_dir "$DIR" 6)" ] || { bad "the newest checkpoint after attempt 0 is ${newest:-none}, not step 6's"; return; }
  local file; file=$(ls "$newest"/model*.safetensors | sort | head -n 1)
  local size; size=$(stat -c %s "$file")
  cp "$file" "$DIR.undamaged"
  if [ "$2" = flip ]; then
    dd if=/dev/urandom of="$file" bs=1 count=4096 seek=$((size / 2)) conv=notrunc status=none
    cmp -s "$file" "$DIR.undamaged" && { bad "the harness could not change $file"; return; }
    note_in "$(log_of 1)" "flipped 4096 bytes at offset $((size / 2)) of $file (bit rot)"
  else
    truncate -s $((size / 2)) "$file"
    note_in "$(log_of 1)" "truncated $file to $((size / 2)) of $size bytes (a torn copy)"
  fi
  rm -f "$DIR.undamaged"
}
flip_between() { damage_between "$1" flip; }
truncate_between() { damage_between "$1" truncate; }

# Before attempt 1: the newest checkpoint's meta.json says a newer format (as a newer vidit
# writes it); before attempt 2 it is put back (the vidit that wrote it is used again).
newer_format_between() {
  local log; log=$(log_of "$1")
  if [ "$1" = 1 ]; then
    NEWER=$(newest_ckpt "$DIR")
    [ -n "$NEWER" ] || { bad "no checkpoint after attempt 0"; return; }
    cp "$NEWER/meta.json" "$DIR.meta.json.orig"
    sed -Ei 's/"vidit-checkpoint-[0-9]+"/"vidit-checkpoint-9"/' "$NEWER/meta.json"
    if grep -q '"vidit-checkpoint-9"' "$NEWER/meta.json"; then
      note_in "$log" "set the format in $NEWER/meta.json to vidit-checkpoint-9 (a newer vidit's)"
    else
      bad "meta.json of $NEWER has no format the harness could change"
    fi
  elif [ "$1" = 2 ] && [ -n "${NEWER:-}" ]; then
    cp "$DIR.meta.json.orig" "$NEWER/meta.json"
    note_in "$log" "put back the original meta.json of $NEWER"
  fi
}
newer_format_check() {
  [ -n "${NEWER:-}" ] || return
  local step; step=$(step_of "$NEWER")
  [ -d "$NEWER" ] || bad "$(basename "$NEWER") is gone after attempt 1"
  ls -d "$DIR"/checkpoints/*.corrupt* >/dev/null 2>&1 && bad "something was set aside: $(ls -d "$DIR"/checkpoints/*.corrupt* | xargs -n1 basename | tr '\n' ' ')"
  said "$(log_of 2)" 0 | grep -q " resumed from step $step\$" || bad "attempt 2 did not resume from step $step (the checkpoint put back)"
  add_note "before attempt 1 the newest checkpoint's (step $step) meta.json says format 9 (harness): named, left in place; put back before attempt 2, which resumes from it"
}

# Before attempt 1: manifest.json removed from the newest checkpoint.
manifest_removed_between() {
  [ "$1" = 1 ] || return 0
  NO_MANIFEST=$(newest_ckpt "$DIR")
  [ -n "$NO_MANIFEST" ] || { bad "no checkpoint after attempt 0"; return; }
  rm -f "$NO_MANIFEST/manifest.json"
  note_in "$(log_of 1)" "removed $NO_MANIFEST/manifest.json"
}
manifest_removed_check() {
  [ -n "${NO_MANIFEST:-}" ] || return
  local name; name=$(basename "$NO_MANIFEST")
  local prev; prev=$(ls -d "$DIR"/checkpoints/step_* | grep -E '/step_[0-9]{8}$' | sort | awk -v n="$name" '{ b = $0; sub(/.*\//, "", b); if (b < n) p = $0 } END { print p }')
  local log; log=$(log_of 1)
  said "$log" 0 | grep -q "has no manifest.json" || bad "attempt 1 did not name the missing manifest"
  [ -d "$NO_MANIFEST.corrupt" ] || bad "$name was not set aside"
  said "$log" 0 | grep -qE " resuming from .*/step_[0-9]{8} instead" || bad "attempt 1 did not fall back"
  add_note "before attempt 1 manifest.json removed from the newest checkpoint, $name (harness): set aside, fell back to the one before"
}

# The load faults: attempt 1 stops with exit 74, touching nothing; attempt 2 resumes from the
# checkpoint attempt 1 could not read.
load_fault_check() {
  local log1 log2; log1=$(log_of 1) log2=$(log_of 2)
  local named; named=$(said "$log1" 0 | sed -nE 's/.*error: checkpoint ([^ ]*step_([0-9]{8})) could not be read on .*/\2/p' | head -n 1)
  [ -n "$named" ] || { bad "attempt 1 did not name the checkpoint it could not read"; return; }
  named=$((10#$named))
  ls -d "$DIR"/checkpoints/*.corrupt* >/dev/null 2>&1 && bad "a readable checkpoint was set aside: $(ls -d "$DIR"/checkpoints/*.corrupt* | xargs -n1 basename | tr '\n' ' ')"
  said "$log2" 0 | grep -q " resumed from step $named\$" || bad "attempt 2 did not resume from step $named, which attempt 1 could not read"
  add_note "attempt 1 could not read step $named (exit 74, nothing set aside); attempt 2 resumed from it"
}

# A reused pid: vidit.lock names a live process of this host (a sleep the harness started)
# with another start time, as when a restart in a container gets the dead run's pid.
LOCK_HOLDER=""
reused_pid_lock_prepare() {
  sleep 120 &
  LOCK_HOLDER=$!
  local ticks; ticks=$(sed 's/.*) //' "/proc/$LOCK_HOLDER/stat" | awk '{ print $20 }')  # field 22
  local wrong=$((ticks > 100 ? ticks - 100 : ticks + 100))
  local host; host=$(cat /proc/sys/kernel/hostname)
  local boot; boot=$(cat /proc/sys/kernel/random/boot_id)
  local ns; ns=$(readlink /proc/self/ns/pid)
  printf '{"boot_id":"%s","host":"%s","pid":%d,"pid_ns":"%s","proc_start":%d,"started":%d}\n' \
    "$boot" "$host" "$LOCK_HOLDER" "$ns" "$wrong" "$(date +%s)" >"$DIR/vidit.lock"
  note_in "$(log_of 0)" "wrote $DIR/vidit.lock: pid $LOCK_HOLDER (alive: a sleep), proc_start $wrong (it started at $ticks)"
}
reused_pid_lock_check() {
  kill -0 "$LOCK_HOLDER" 2>/dev/null || bad "the process holding the reused pid was disturbed"
  said "$(log_of 0)" 0 | grep -q "was taken over: pid $LOCK_HOLDER now belongs to another process" ||
    bad "the lock was not taken over as a reused pid's"
  kill "$LOCK_HOLDER" 2>/dev/null
  wait "$LOCK_HOLDER" 2>/dev/null
  add_note "vidit.lock names a live pid of this host with another start time (harness): taken over at once, its process left alone"
}

nan_check() {
  grep -q '"skipped_update"' "$DIR/events.jsonl" 2>/dev/null && grep '"skipped_update"' "$DIR/events.jsonl" | grep -q '"step":5[,}]' ||
    bad "events.jsonl has no skipped update at step 5"
  add_note "step 5's update skipped on every rank"
}

# ---- the cases ----------------------------------------------------------------------------
KILL='rank 1 kills itself \(SIGKILL\) after step 5$'
MPI_KILLED1='mpirun noticed that process rank 1 with PID [0-9]+ on node [^ ]+ exited on signal 9'

run_case kill9_mid_step --args "faults.kind=kill faults.step=5 faults.rank=1" --exits 137,0 \
  --fired "0 1 fault injection: $KILL" --resumes "1 4"
run_case hung_rank --args "faults.kind=hang faults.step=5 faults.rank=1" --exits 86,0 --bound 60 \
  --fired "0 1 fault injection: rank 1 hangs after step 5$" \
  --says "0 * watchdog: rank [01] on [^ ]+ \(pid [0-9]+\) made no progress" --resumes "1 4" \
  --note "the watchdog ends the job (exit 86)"
# The write of step 6 runs in the background (two saves may be in flight): on a loaded machine
# training may go on to step 10, whose save waits for it, before the writer reaches the middle of
# its first file; from the checkpoint of step 4 that is up to three intervals lost.
run_case kill_during_save --args "faults.kind=kill_in_save faults.step=6 faults.rank=1" --exits 137,0 \
  --lost $((3 * EVERY)) \
  --fired "0 1 fault injection: rank kills itself \(SIGKILL\) while writing .*/step_00000006\.tmp/" \
  --note "SIGKILL mid-file in the background write of step 6"
run_case disk_full_in_save --args "faults.kind=disk_full faults.step=4 faults.rank=1" --exits 0 \
  --fired "0 1 fault injection: the disk is full \(ENOSPC\) while writing .*/step_00000004\.tmp/" \
  --says "0 0 checkpoint of step 4 was not saved \(failed on rank 1.*Training goes on" \
  --note "save of step 4 fails (ENOSPC on rank 1), training goes on"
run_case io_error_in_save --args "faults.kind=io_error faults.step=4 faults.rank=0" --exits 0 \
  --fired "0 0 fault injection: fsync of .*/step_00000004\.tmp/.* fails \(EIO\)" \
  --says "0 0 checkpoint of step 4 was not saved \(failed on rank 0.*Training goes on" \
  --note "fsync fails (EIO on rank 0), training goes on"
run_case slow_storage --args "faults.kind=slow_storage faults.step=4 faults.rank=1 faults.seconds=1" --exits 0 \
  --fired "0 1 fault injection: storage is slow \(1\.0 s more per file\)" --note "see below"
run_case storage_hangs --args "faults.kind=slow_storage faults.step=4 faults.rank=1 faults.seconds=4 checkpoint.timeout_s=1" \
  --exits 2,0 --lost $((STEPS - EVERY)) --bound 60 \
  --fired "0 1 fault injection: storage is slow \(4\.0 s more per file\)" \
  --says "0 0 error: a rank's checkpoint write did not end within checkpoint\.timeout_s \(1 s\)" \
  --resumes "1 2" \
  --note "rank 1's write of step 4 outlasts checkpoint.timeout_s: every rank stops, the next attempt resumes"
run_case newest_corrupted --args "faults.kind=kill faults.step=7 faults.rank=1" --exits 137,0 --lost $((2 * EVERY + 1)) \
  --between flip_between --fired "0 1 fault injection: rank 1 kills itself \(SIGKILL\) after step 7$" \
  --fired "1 - harness: flipped 4096 bytes at offset [0-9]+ of .*/step_00000006/model\." \
  --says "1 0 checkpoint .*/step_00000006 cannot be used: .* does not match its checksum" \
  --says "1 0 checkpoint .*/step_00000006 is corrupt: " --says "1 0  *set aside as .*/step_00000006\.corrupt" \
  --says "1 0 resuming from .*/step_00000004 instead" --resumes "1 4" \
  --note "rank 1 killed after step 7; then 4 KiB of step 6's first model part overwritten (harness): checksum mismatch named, set aside"
run_case newest_truncated --args "faults.kind=kill faults.step=7 faults.rank=1" --exits 137,0 --lost $((2 * EVERY + 1)) \
  --between truncate_between --fired "0 1 fault injection: rank 1 kills itself \(SIGKILL\) after step 7$" \
  --fired "1 - harness: truncated .*/step_00000006/model\.[^ ]* to [0-9]+ of [0-9]+ bytes" \
  --says "1 0 checkpoint .*/step_00000006 cannot be used: " --says "1 0 checkpoint .*/step_00000006 is corrupt: " \
  --says "1 0  *set aside as .*/step_00000006\.corrupt" --says "1 0 resuming from .*/step_00000004 instead" --resumes "1 4" \
  --note "rank 1 killed after step 7; then step 6's first model part cut to half (harness): size mismatch named, set aside"
run_case sigterm --args "faults.kind=sigterm faults.step=5 faults.rank=1" --exits 75,0 \
  --fired "0 1 fault injection: rank 1 sends itself SIGTERM after step 5$" \
  --says "0 0 stop requested \(signal [0-9]+ on another rank\) after step 5" --resumes "1 5" --lost 0 \
  --note "every rank stops after step 5, saves, exits 75"
run_case preempted --exits 75,0 --outside preempt_after_ckpt2 --lost 0 \
  --fired "0 - harness: SIGTERM to every rank" --says "0 0 stop requested \(signal 15\) after step [0-9]+" \
  --note "SIGTERM to every rank once step 2 is committed (harness, as a scheduler): saves, exits 75, resumes where it stopped"
run_case second_failure --args "faults.kind=exit faults.step=7 faults.rank=0 faults.attempt=1" --exits 137,17,0 \
  --outside kill_rank1_after_ckpt4 \
  --fired "0 - harness: SIGKILL to rank 1" --fired "0 - $MPI_KILLED1" \
  --fired "1 0 fault injection: rank 0 exits after step 7$" --resumes "2 6" \
  --note "rank 1 SIGKILLed once step 4 is committed (harness), then rank 0 exits after step 7 of the restart (faults.attempt=1)"
run_case torchrun_max_restarts --launcher torchrun --args "faults.kind=kill faults.step=5 faults.rank=1" --exits 137,0 \
  --fired "0 1 fault injection: $KILL" --resumes "1 4" --note "the agent restarts the workers"
run_case nan_gradient --args "faults.kind=nan_grad faults.step=5 faults.rank=1" --exits 0 --equal no \
  --fired "0 1 fault injection: rank 1 makes its gradients NaN in backward \(an overflow\) of step 5$" --check nan_check
# One bit of one replica's weights flips (2 replicas, DDP, in every attempt; the reference run
# has that mesh too): found before the save of step 6 (exit 87, both ranks named: two replicas
# have no majority), resumed from step 4.
run_case sdc_bitflip --mesh "parallel.shard=1 parallel.replicate=2" \
  --args "faults.kind=bitflip faults.step=5 faults.rank=1" --exits 87,0 \
  --fired "0 1 fault injection: rank 1 flipped bit 22 of .* after step 5" \
  --says "0 * (error: )?silent data corruption after step 6: rank 0 \(" --resumes "1 4" \
  --note "DDP x 2: bit 22 of one weight of rank 1 flips after step 5; found before the save of step 6, exit 87"
run_case slow_rank --args "faults.kind=slow faults.step=2 faults.rank=1 faults.seconds=0.15" --exits 0 \
  --fired "0 1 fault injection: rank 1 computes slowly \(0\.15 s more per step\) from step 2$" \
  --says "0 * straggler: rank 1 \(" --note "rank 1's forward 0.15 s slower from step 2, named"
# Faults while a restart reads its checkpoint (faults.attempt=1; faults.step=0: the first one it
# reads), after a node was lost in attempt 0.
for spec in "load_io_error 1 EIO" "load_permission 0 EACCES" "load_no_memory 1 ENOMEM"; do
  read -r kind rank errno <<<"$spec"
  run_case "$kind" --args "faults.kind=$kind faults.step=0 faults.rank=$rank faults.attempt=1" --exits 137,74,0 \
    --outside kill_rank1_after_ckpt4 --fired "0 - harness: SIGKILL to rank 1" --fired "0 - $MPI_KILLED1" \
    --fired "1 $rank fault injection: mapping .* for reading fails \($errno\)" \
    --says "1 0 error: checkpoint .* could not be read on rank $rank .*nothing was set aside" --check load_fault_check \
    --note "rank 1 SIGKILLed once step 4 is committed (harness); $errno on rank $rank mapping the first file in the restart"
done
run_case newer_format --exits 137,74,0 --outside kill_rank1_after_ckpt4 --between newer_format_between \
  --fired "0 - harness: SIGKILL to rank 1" --fired "0 - $MPI_KILLED1" --fired "1 - harness: set the format" \
  --says "1 0 error: .*written by a newer vidit" --check newer_format_check
# Lost: back to step 2 (the newest checkpoint set aside), and the steps run before the kill; an
# asynchronous commit of step 4 seen late on a loaded machine (metrics at step 8 when it was seen)
# is one interval more: at most three intervals.
run_case manifest_removed --exits 137,0 --lost $((3 * EVERY)) --outside kill_rank1_after_ckpt4 \
  --between manifest_removed_between --fired "0 - harness: SIGKILL to rank 1" --fired "0 - $MPI_KILLED1" --fired "1 - harness: removed" \
  --check manifest_removed_check
run_case crash_in_commit --args "faults.kind=crash_in_commit faults.step=6 faults.rank=0" --exits 137,0 \
  --fired "0 0 fault injection: rank kills itself \(SIGKILL\) in the commit, after renaming .*/step_00000006\.tmp to .*/step_00000006$" \
  --resumes "1 6" --note "rank 0 SIGKILLed between the commit's rename of step_6.tmp and \`latest\`: found by the scan"
# A reused pid holding the lock (the lock records the holder's start time: run_lock.h).
if ! wanted reused_pid_lock; then
  :
elif grep -q '"proc_start"' "$ROOT/src/resilience/run_lock.h" 2>/dev/null; then
  run_case reused_pid_lock --exits 0 --before reused_pid_lock_prepare --check reused_pid_lock_check \
    --fired "0 - harness: wrote .*/vidit\.lock" --says "0 0 the run lock .* was taken over: pid [0-9]+ now belongs to another process"
else
  ROWS+=("| reused_pid_lock | mpi | skipped | - | - | - | - | - | - | - | src/resilience/run_lock.h records no \"proc_start\" of the holder yet: a reused pid cannot be told from the holder |")
  echo "run_matrix: reused_pid_lock: SKIPPED: run_lock.h records no proc_start (the holder's start time) yet"
fi

# ---- cases that are not a single job ------------------------------------------------------

# A second run on the same out_dir while the first runs (a requeued job started twice): refused,
# naming the holder; the first one goes on undisturbed.
if wanted second_run_same_out_dir; then
LOCKED=$WORK/second_run_same_out_dir
rm -rf "$LOCKED" "$LOCKED".*.log* && mkdir -p "$LOCKED"
make_cmd "$LOCKED" mpi "faults.kind=slow faults.step=1 faults.rank=0 faults.seconds=1.5"
start_attempt "$LOCKED.first.log" 0
FIRST=$ATTEMPT_PID
for _ in $(seq 200); do [ -f "$LOCKED/vidit.lock" ] && break; sleep 0.1; done
make_cmd "$LOCKED" mpi ""
start_attempt "$LOCKED.second.log" 0
wait_attempt "$LOCKED.second.log"
SECOND=$STATUS
ATTEMPT_PID=$FIRST
wait_attempt "$LOCKED.first.log"
FIRST_STATUS=$STATUS
lock_ok=yes lock_note="" lock_fired=yes
grep -q 'another run is using' "$LOCKED.second.log" || { lock_fired=no; lock_ok=no; lock_note="second run not refused;"; }
[ "$SECOND" != 0 ] || { lock_ok=no; lock_note="$lock_note second run exited 0;"; }
[ "$FIRST_STATUS" = 0 ] || { lock_ok=no; lock_note="$lock_note first run exited $FIRST_STATUS;"; }
lock_equal=no
"$VIDIT" checkpoint compare "$(final_ckpt "$LOCKED")" "$(final_ckpt "$STRAIGHT")" >"$LOCKED.compare.log" 2>&1 && lock_equal=yes
[ "$lock_equal" = yes ] || { lock_ok=no; lock_note="$lock_note first run disturbed;"; }
[ "$lock_ok" = yes ] || FAILED=1
holder=$(grep -o 'another run is using [^ ]* ([^)]*)' "$LOCKED.second.log" | head -n 1 | sed "s|$WORK/||g")
ROWS+=("| second_run_same_out_dir | mpi | $lock_ok | $FIRST_STATUS (first), $SECOND (second) | 0 | $lock_fired | 0 | - | - | $lock_equal | ${lock_note}${holder:+second refused: $holder} |")
echo "run_matrix: second_run_same_out_dir: passed $lock_ok (first exit $FIRST_STATUS, second exit $SECOND) $lock_note"
fi

# Slow storage did not stall training: the slow save paused it only for its snapshot; a later
# save paused it while the slow one was still being written (two saves may be in flight, a third
# waits for the oldest).
pause_of() { sed -n "s/.*\"blocked_s\":\([0-9.e-]*\).*\"step\":$2,.*/\1/p" "$WORK/$1/saves.jsonl" 2>/dev/null | awk '{ printf "%.3f", $1 }'; }
SLOW_PAUSE=$(pause_of slow_storage 4)
LATER_PAUSES=""
for s in $(seq $((4 + EVERY)) $EVERY $STEPS); do LATER_PAUSES="$LATER_PAUSES${LATER_PAUSES:+, }step $s $(pause_of slow_storage $s) s"; done

{
  echo "| case | launcher | passed | exit statuses | restarts | fired | lost steps | recovery s | bound s | equal to uninterrupted | notes |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for r in "${ROWS[@]}"; do echo "$r"; done
  echo
  echo "slow_storage: the slow save (step 4, 1 s more per file on rank 1) paused training ${SLOW_PAUSE:-?} s; the saves"
  echo "after it paused training: $LATER_PAUSES (two saves in flight at most: a third waits for the oldest)."
} | tee "$WORK/matrix.md"
echo "run_matrix: $([ $FAILED = 0 ] && echo "every case passed" || echo "FAILED") in $((SECONDS - T_MATRIX)) s after the reference run (logs in $WORK)"
exit $FAILED
