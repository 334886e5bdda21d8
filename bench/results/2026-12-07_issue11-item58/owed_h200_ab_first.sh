#!/usr/bin/env bash
# NOTES item 58: item 55's owed_h200.sh reordered for a short budget: the branch's A/B
# (qwen2.5-7b and 16 / 56 / 64 heads: decides rope-decode-heads-only) and item 54's six
# 8-lane shapes first, then the GPU suite, then the rest of owed_h200.sh's benches and
# MORE_BENCHES. Each part is one gpu_session.sh run with its own results folder under
# $OUT (ab/, suite/, rest/) and its share of DEADLINE_S (AB_S, then SUITE_S, then what is
# left). Stops on any other card.
#
#   CUPYKERN_COMMIT=$(git rev-parse --short HEAD) DEADLINE_S=400 bash bench/results/2026-12-07_issue11-item58/owed_h200_ab_first.sh
set -u
unset PEERS  # set and empty, gpu_session.sh would run the whole peers table (item 54)
nvidia-smi -L
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo NOT-AN-H200; exit 3; }
cd "$(dirname "$0")/../../.."
I53=bench/results/2026-12-06_issue11-item53
I54=bench/results/2026-12-06_issue11-item54
T=${TAG:-a55}
DEADLINE_S=${DEADLINE_S:-400}
AB="$I53/rope_token_prefill.py --models qwen2.5-7b --sizes 528,1024,1584,2300,3036,4092,8192,16384 --tag ${T}q"
AB+=";$I54/rope_token_prefill.py --models llama-3.1-8b@16,llama-3.1-8b@56,llama-3.1-8b@64 --sizes 528,1024,1584,2300,3036,4092,8192 --tag ${T}h"
AB+=";$I54/rope_token_prefill.py --models llama-3.1-8b@160,llama-3.1-8b@140,llama-3.1-8b@48,llama-3.1-8b@96,llama-3.1-8b@24,llama-3.1-8b@84 --sizes 2300,2700,3036,3500,3900,4091,4092 --tag $T"
REST="$I53/rope_token_prefill.py --models llama-3.1-8b --sizes 3036,3500,3900,4091,4092 --tag $T"
REST+=";$I54/rope_token_prefill.py --models llama-3.1-8b@24,llama-3.1-8b@48,llama-3.1-8b@84,llama-3.1-8b@96 --sizes 4600,5200,5800 --tag ${T}x"
REST+=";$I53/rope_blocks4096.py --tag $T"
REST+=${MORE_BENCHES:+";$MORE_BENCHES"}
left() { echo $((DEADLINE_S - SECONDS > 5 ? DEADLINE_S - SECONDS : 5)); }
share() { local left_s; left_s=$(left); echo $(($1 < left_s ? $1 : left_s)); }  # a part's seconds
BASE_OUT=${OUT:-$PWD/.out}
OUT=$BASE_OUT/ab TESTS= BENCHES="$AB" DEADLINE_S=$(share "${AB_S:-200}") bash bench/gpu_session.sh
[ "${SUITE_S:-200}" = 0 ] ||  # SUITE_S=0: no suite (the A/B and the rest alone)
  OUT=$BASE_OUT/suite TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= \
    DEADLINE_S=$(share "${SUITE_S:-200}") bash bench/gpu_session.sh
OUT=$BASE_OUT/rest TESTS= BENCHES="$REST" DEADLINE_S=$(left) bash bench/gpu_session.sh
