#!/usr/bin/env bash
# A whole host lost mid-run, and the job going on without it: four "hosts" (network namespaces
# with their own hostnames and links, netns_hosts.sh), one rank each, data parallel over gloo
# (the torchrun environment), a checkpoint every 2 steps to a file system all hosts share. The
# product's fault injection SIGKILLs the rank on node2 after step 7, and the script then takes
# every link of node2 down: the node is gone. The survivors must end by themselves; the job is
# started again, as a launcher would, on the three hosts left (a smaller world: the checkpoint
# loads at any mesh). It must resume from the newest checkpoint (at most 2 steps lost), name the
# rank lost on node2 and put node2 on the exclude list (train.exclude_after_crashes = 1), log
# every step once, and end with the loss of an uninterrupted four-host run (data parallel
# reproduces one global batch at any world size, to fp32 rounding).
#
# usage: tests/faults/node_loss.sh path/to/vidit
# Needs root, ip and unshare; exits 77 (skipped) without them.
set -uo pipefail
VIDIT=$(realpath "$1")
HOSTS=4
TAG=nl$$
fail() { echo "FAIL: $*"; exit 1; }
# shellcheck source=netns_hosts.sh
source "$(dirname "$0")/netns_hosts.sh"
make_hosts || exit 77
OUT=$(mktemp -d)
ARGS="model.dim=32 model.ffn_dim=64 model.heads=2 model.layers=2 model.in_channels=4 model.patch=[1,2,2] \
model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic data.latent_frames=2 \
data.latent_height=4 data.latent_width=4 train.batch_size=12 train.threads=1 train.steps=12 train.log_every=1 \
checkpoint.every=2 train.exclude_after_crashes=1 train.stall_min_s=10 train.stall_steps=5"

# launch NAME ATTEMPT HOST...: rank r on the r-th host given; rank 0's output in $OUT/NAME.a<ATTEMPT>.0
launch() {
  local name=$1 attempt=$2; shift 2
  local hosts=("$@") port=$((20000 + RANDOM % 20000)) r=0
  PIDS=()
  for h in "${hosts[@]}"; do
    on_host "$h" "env RANK=$r WORLD_SIZE=${#hosts[@]} LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=$(addr "${hosts[0]}") \
      MASTER_PORT=$port TORCHELASTIC_RESTART_COUNT=$attempt VIDIT_COMM=gloo timeout 120 $VIDIT train --set $ARGS \
      parallel.replicate=${#hosts[@]} train.out_dir=$OUT/$name $EXTRA" >"$OUT/$name.a$attempt.$r" 2>&1 &
    PIDS+=($!)
    r=$((r + 1))
  done
}
# wait_all: the exit statuses of $PIDS, in $S (not in a subshell: wait needs this shell's children).
wait_all() { S=""; for p in "${PIDS[@]}"; do wait "$p"; S="$S $?"; done; }
last_loss() { sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p' "$1/metrics.jsonl" | tail -n 1; }

EXTRA=""
launch straight 0 0 1 2 3
wait_all
[ "$S" = " 0 0 0 0" ] || { cat "$OUT/straight.a0.0"; fail "the uninterrupted run failed:$S"; }

EXTRA="faults.kind=kill faults.step=7 faults.rank=2"
launch lost 0 0 1 2 3
wait "${PIDS[2]}"  # node2's rank, killed by the fault
T0=$EPOCHREALTIME
for j in 0 1 3; do ip -n "$(ns 2)" link set "v2$j" down; done
s0=""
for p in "${PIDS[0]}" "${PIDS[1]}" "${PIDS[3]}"; do wait "$p"; s0="$s0 $?"; done
T1=$EPOCHREALTIME
echo "--- attempt 0 (node2 lost after step 7): survivors exited with$s0 in $(awk "BEGIN { printf \"%.1f\", $T1 - $T0 }") s"
grep -h "fault injection\|error:\|watchdog" "$OUT"/lost.a0.* | head -5
for st in $s0; do [ "$st" != 0 ] || fail "a survivor of the node's loss exited 0"; done

EXTRA=""
launch lost 1 0 1 3
wait_all
s1=$S
T2=$EPOCHREALTIME
echo "--- attempt 1 on node0, node1, node3 (exit$s1)"
grep -h "resumed\|previous attempt lost\|lost a rank\|^done" "$OUT/lost.a1.0"
[ "$s1" = " 0 0 0" ] || { cat "$OUT/lost.a1.0"; fail "the job did not finish on the three hosts left:$s1"; }
resumed=$(sed -n 's/^resumed from step \([0-9]*\)$/\1/p' "$OUT/lost.a1.0")
[ -n "$resumed" ] && [ "$resumed" -ge 5 ] || fail "resumed from step '${resumed}', not from the newest checkpoint (6, or 4 if its save was cut)"
grep -q "the previous attempt lost rank 2 on node2" "$OUT/lost.a1.0" || fail "the lost rank on node2 is not named"
[ "$(cat "$OUT/lost/exclude_hosts.txt" 2>/dev/null)" = node2 ] || fail "node2 is not (alone) on the exclude list"
steps=$(sed -n 's/.*"step":\([0-9]*\).*/\1/p' "$OUT/lost/metrics.jsonl" | tr '\n' ' ')
[ "$steps" = "1 2 3 4 5 6 7 8 9 10 11 12 " ] || fail "metrics.jsonl steps: $steps"
a=$(last_loss "$OUT/straight") b=$(last_loss "$OUT/lost")
awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-4 * (a < 0 ? -a : a)) }' ||
  fail "final loss $b differs from the uninterrupted run's $a"
echo "| node_loss | gloo (4 hosts -> 3) | yes | 1 | $((7 - resumed)) | $(awk "BEGIN { printf \"%.1f\", $T2 - $T0 }") | loss $b vs $a | node2 named and excluded |"
echo "node_loss: PASS"
rm -rf "$OUT"
