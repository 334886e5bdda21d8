#!/usr/bin/env bash
# NOTES item 62: one device call, from the repository root (carry .whl; CUPYKERN_COMMIT set).
# Always: tests/test_timing.py, after_peer_probe.py --first-timings (about 60 s, any card). Then
#   on an H200: the whole peers table with FW untimed flushed calls before each cold timing
#               (peers_ab.py FW), with what is left of DEADLINE_S;
#   on another card (or with TABLE=0): the A/B of the method, rms_norm and the fused add of 8b and 70b at
#               256-4096 tokens with 0 and FW flushed warm-up calls, turned: 0, FW, 0, FW.
set -u
unset PEERS
cd "$(dirname "$0")/../../.."
nvidia-smi -L
BASE_OUT=${OUT:-$PWD/.out}
DEADLINE_S=${DEADLINE_S:-585}
FW=${FW:-100}
D=bench/results/2026-12-07_issue11-item62
OUT=$BASE_OUT/probe TESTS=tests/test_timing.py DEADLINE_S=100 \
  BENCHES="bench/results/2026-12-07_issue11-item61/after_peer_probe.py --first-timings --tag ${TAG:-a62}" \
  bash bench/gpu_session.sh
if [ "${TABLE:-1}" = 1 ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$BASE_OUT/peers TESTS= BENCHES="$D/peers_ab.py $FW" DEADLINE_S=$((DEADLINE_S - SECONDS)) bash bench/gpu_session.sh
else
  SUBSET="--ops rms_norm,fused_add_rms_norm --num-tokens 256,1024,4096"
  OUT=$BASE_OUT/ab TESTS= DEADLINE_S=$((DEADLINE_S - SECONDS)) \
    BENCHES="$D/peers_ab.py 0 $SUBSET;$D/peers_ab.py $FW $SUBSET;$D/peers_ab.py 0 $SUBSET;$D/peers_ab.py $FW $SUBSET" \
    bash bench/gpu_session.sh
fi
