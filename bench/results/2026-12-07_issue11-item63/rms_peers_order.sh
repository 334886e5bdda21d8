#!/usr/bin/env bash
# NOTES item 63, call 12 as a script: branch rms-decode-layout-filled (item 62's patch) in the
# peers run's order, rms_norm of 8b and 70b at 256 / 1024 / 2048 / 4096 tokens, main / branch
# / main / branch, each its own process (item 62's peers_ab.py with FW flushed warm-up calls,
# default 0: item 63 found 100 change nothing past the spread). Any card; from the repository
# root (carry .whl; CUPYKERN_COMMIT set). Every run's JSON and log go into one
# $OUT/rms_peers_order.tar.gz (a device call returns at most 8 files).
cd "$(dirname "$0")/../../.."
. bench/results/2026-12-07_issue11-item63/patched_tree.sh
FW=${FW:-0}
ARGS="--ops rms_norm --num-tokens ${NUM_TOKENS:-256,1024,2048,4096}"
P=bench/results/2026-12-07_issue11-item62/peers_ab.py
RMS=/tmp/branch-rms
patched_tree rms bench/results/2026-12-07_issue11-item62/rms-decode-layout-filled
RUNS=$(mktemp -d /tmp/rms-order.XXXX)
for i in 1 2; do
  for tree in main rms; do
    dir=$HERE; commit=${CUPYKERN_COMMIT:-unknown}
    [ $tree = rms ] && dir=$RMS && commit=$commit+rms
    (cd "$dir" && CUPYKERN_COMMIT=$commit OUT=$RUNS/$tree$i TESTS= DEADLINE_S=${STEP_S:-90} \
      BENCHES="$P $FW $ARGS" bash bench/gpu_session.sh > "$RUNS/$tree$i.log" 2>&1)
    grep -A4 "^| model" "$RUNS/$tree$i.log"
  done
done
mkdir -p "$BASE_OUT" && tar czf "$BASE_OUT/rms_peers_order.tar.gz" -C "$RUNS" .
