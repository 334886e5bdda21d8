#!/usr/bin/env bash
# NOTES item 62: a second device call, from the repository root (carry .whl; CUPYKERN_COMMIT
# set). On an H200 only (exit 3 on any other card): main's whole GPU suite, then
# rms_rows_probe.py (share4: the lost branch rms-decode-layout-filled's plan, through
# cupykern.plans' constants) for 8b and 70b, then the peers method's A/B as call.sh's.
set -u
unset PEERS
cd "$(dirname "$0")/../../.."
nvidia-smi -L
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo NOT-AN-H200; exit 3; }
BASE_OUT=${OUT:-$PWD/.out}
DEADLINE_S=${DEADLINE_S:-585}
FW=${FW:-100}
D=bench/results/2026-12-07_issue11-item62
P=bench/results/2026-12-07_issue11-item61/rms_rows_probe.py
S=384,768,1024,1536,2048,3072,4096,6144
OUT=$BASE_OUT/suite TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=240 \
  bash bench/gpu_session.sh
OUT=$BASE_OUT/probe TESTS= DEADLINE_S=90 \
  BENCHES="$P --tag h62d --no-liger --rounds 5 --models llama-3.1-8b --dtypes bf16 --sizes $S;$P --tag h62m --no-liger --rounds 5 --models llama-3.1-70b --sizes $S" \
  bash bench/gpu_session.sh
SUBSET="--ops rms_norm,fused_add_rms_norm --num-tokens 256,1024,4096"
OUT=$BASE_OUT/ab TESTS= DEADLINE_S=$((DEADLINE_S - SECONDS)) \
  BENCHES="$D/peers_ab.py 0 $SUBSET;$D/peers_ab.py $FW $SUBSET;$D/peers_ab.py 0 $SUBSET;$D/peers_ab.py $FW $SUBSET" \
  bash bench/gpu_session.sh
