#!/usr/bin/env bash
# NOTES item 55: the H200 runs owed since session 39, in one device call (DEADLINE_S below the
# budget less ~120 s; carry [".whl"]; kind nvidia-h200). Stops on any other card: the H100's
# half of every reading here is in items 53-55.
#
#   CUPYKERN_COMMIT=$(git rev-parse --short HEAD) DEADLINE_S=470 bash bench/results/2026-12-06_issue11-item55/owed_h200.sh
#
# In order (a step cut by the deadline leaves the ones before it whole): the GPU suite
# (predicted `3826 passed` at main, golden included; the branch rope-decode-heads-only adds
# 32 cases), qwen2.5-7b and the other 4-heads shapes (decide that branch), item 54's six
# 8-lane shapes (decide the 5-heads narrowing), 8b's window, past 31 tokens an SM, then
# rope_blocks4096.py.
set -u
unset PEERS  # set and empty, gpu_session.sh would run the whole peers table (item 54)
nvidia-smi -L
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo NOT-AN-H200; exit 3; }
cd "$(dirname "$0")/../../.."
I53=bench/results/2026-12-06_issue11-item53
I54=bench/results/2026-12-06_issue11-item54
T=${TAG:-a55}
B="$I53/rope_token_prefill.py --models qwen2.5-7b --sizes 528,1024,1584,2300,3036,4092,8192,16384 --tag ${T}q"
B+=";$I54/rope_token_prefill.py --models llama-3.1-8b@16,llama-3.1-8b@56,llama-3.1-8b@64 --sizes 528,1024,1584,2300,3036,4092,8192 --tag ${T}h"
B+=";$I54/rope_token_prefill.py --models llama-3.1-8b@160,llama-3.1-8b@140,llama-3.1-8b@48,llama-3.1-8b@96,llama-3.1-8b@24,llama-3.1-8b@84 --sizes 2300,2700,3036,3500,3900,4091,4092 --tag $T"
B+=";$I53/rope_token_prefill.py --models llama-3.1-8b --sizes 3036,3500,3900,4091,4092 --tag $T"
B+=";$I54/rope_token_prefill.py --models llama-3.1-8b@24,llama-3.1-8b@48,llama-3.1-8b@84,llama-3.1-8b@96 --sizes 4600,5200,5800 --tag ${T}x"
B+=";$I53/rope_blocks4096.py --tag $T"
B+=${MORE_BENCHES:+";$MORE_BENCHES"}  # item 56: more benches after these
TESTS="tests --ignore=tests/test_llm.py" BENCHES="$B" PYTEST_ARGS="-n 15" DEADLINE_S=${DEADLINE_S:-470} \
  bash bench/gpu_session.sh
