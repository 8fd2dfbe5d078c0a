#!/usr/bin/env bash
# A slow link and a host with a slow network, between real "hosts": four network namespaces with
# their own hostnames and a link between every two (netns_hosts.sh). tc slows one link (netem delay and rate where the kernel
# has it, else a tbf rate limit), then every link of one host. `vidit health --checks network` runs one rank per host (the
# torchrun environment; gloo binds to the address its hostname resolves to) and must name the slow pair in the
# first case and exclude the host in the second. Last, `vidit train` runs on the four hosts as two
# replicas of two FSDP shards each, with the link inside the first replica's shard group slowed:
# the run's summary must name that group (ranks 0 and 1 on node0 and node1) and no other.
#
# usage: tests/faults/slow_link.sh path/to/vidit
# Needs root, ip, tc and unshare; exits 77 (skipped) without them.
set -uo pipefail
VIDIT=$(realpath "$1")
HOSTS=4
TAG=vl$$
fail() { echo "FAIL: $*"; exit 1; }

command -v tc >/dev/null || { echo "skipped: needs tc"; exit 77; }
# shellcheck source=netns_hosts.sh
source "$(dirname "$0")/netns_hosts.sh"
make_hosts || exit 77
# slow i j: both directions of the link between hosts i and j.
SLOW="netem delay 4ms rate 200mbit"
slow() {
  tc -n "$(ns "$1")" qdisc replace dev "v$1$2" root $SLOW 2>/dev/null || {
    SLOW="tbf rate 200mbit burst 64kb latency 100ms"
    tc -n "$(ns "$1")" qdisc replace dev "v$1$2" root $SLOW || { echo "skipped: tc has neither netem nor tbf"; exit 77; }
  }
  tc -n "$(ns "$2")" qdisc replace dev "v$2$1" root $SLOW
}
fast() { tc -n "$(ns "$1")" qdisc del dev "v$1$2" root 2>/dev/null; tc -n "$(ns "$2")" qdisc del dev "v$2$1" root 2>/dev/null; }

OUT=$(mktemp -d)
run() {  # run NAME: one rank per host; rank 0's output in $OUT/NAME.0
  local port=$((20000 + RANDOM % 20000)) pids=()
  for i in $(seq 0 $((HOSTS - 1))); do
    on_host "$i" "env RANK=$i WORLD_SIZE=$HOSTS LOCAL_RANK=0 \
      LOCAL_WORLD_SIZE=1 MASTER_ADDR=$(addr 0) MASTER_PORT=$port VIDIT_COMM=gloo \
      timeout 120 $VIDIT health --checks network --exclude-file $OUT/$1.exclude --set train.threads=1 \
      train.out_dir=$OUT/$1" >"$OUT/$1.$i" 2>&1 &
    pids+=($!)
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=$?; done
  echo "--- $1 (exit $status)"; cat "$OUT/$1.0"
  return "$status"
}

# 1. The link between node0 and node1 is slow: named, nobody excluded.
slow 0 1
echo "slow links: tc qdisc $SLOW"
run slow_link; s=$?
[ $s = 0 ] || fail "a slow link alone must not make a host unhealthy (exit $s)"
grep -q "slow link: node0 - node1" "$OUT/slow_link.0" || fail "the slow pair node0 - node1 is not named"
[ "$(grep -c 'slow link:' "$OUT/slow_link.0")" = 1 ] || fail "another pair was named slow"
fast 0 1

# 2. Every link of node2 is slow (its network): node2 is unhealthy and excluded; no link is blamed.
for j in 0 1 3; do slow 2 $j; done
run slow_host; s=$?
[ $s = 3 ] || fail "a host with a slow network must make vidit health exit 3 (exit $s)"
grep -q "unhealthy: node2;" "$OUT/slow_host.0" || fail "node2 is not named unhealthy"
[ "$(cat "$OUT/slow_host.exclude")" = node2 ] || fail "the exclude list is not just node2: $(cat "$OUT/slow_host.exclude")"
grep -q "slow link:" "$OUT/slow_host.0" && fail "a link was blamed for node2's network"
for j in 0 1 3; do fast 2 $j; done

# 3. Training: replicas {0,1} and {2,3} (hosts node0..node3), FSDP inside each. The shard group of
# the first replica talks over the slowed link node0 - node1; its peers' links are fast.
slow 0 1
port=$((20000 + RANDOM % 20000)); pids=()
for i in $(seq 0 $((HOSTS - 1))); do
  on_host "$i" "env RANK=$i WORLD_SIZE=$HOSTS LOCAL_RANK=0 \
    LOCAL_WORLD_SIZE=1 MASTER_ADDR=$(addr 0) MASTER_PORT=$port VIDIT_COMM=gloo timeout 180 $VIDIT train --set \
    model.dim=256 model.ffn_dim=512 model.heads=4 model.layers=2 model.in_channels=4 model.patch=[1,2,2] \
    model.out_channels=4 model.text_dim=8 model.text_len=4 model.freq_dim=16 data.source=synthetic \
    data.latent_frames=2 data.latent_height=4 data.latent_width=4 train.batch_size=4 train.threads=1 \
    train.steps=8 train.log_every=1 parallel.replicate=2 parallel.shard=2 train.out_dir=$OUT/train" \
    >"$OUT/train.$i" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
echo "--- train (exit $status)"; grep -A40 "^communication on rank 0" "$OUT/train.0"; grep "slow group" "$OUT/train.0"
[ $status = 0 ] || { cat "$OUT/train.0"; fail "training across the namespaces failed (exit $status)"; }
grep -q "slow group: shard group 0 (rank 0 on node0, rank 1 on node1)" "$OUT/train.0" ||
  fail "the shard group over the slow link node0 - node1 is not named"
grep "slow group:" "$OUT/train.0" | grep -v "slow group: shard group 0 " && fail "another group was named slow"
grep -q '"slow_group"' "$OUT/train/events.jsonl" || fail "no slow_group event in events.jsonl"
$VIDIT doctor "$OUT/train" | grep -q "slow shard group (ranks 0 1 on node0 node1)" || fail "vidit doctor does not tell the slow group"
echo "slow_link: PASS"
rm -rf "$OUT"
