#!/usr/bin/env bash
# NOTES item 64: the three parked branches together (rms-decode-layout-filled, then
# rope-token-6-lanes, then rope-decode-heads-only rebased on it: phi-3-mini's 6-lane token
# kernel runs 528-3035 tokens in its decode heads too), as issue11-all/0001-*.patch, in one
# call on any card, from the repository root (carry .whl; CUPYKERN_COMMIT set to main's sha):
#   1. compute-sanitizer memcheck and racecheck on the norm family (70b; 1 / 1024 / 2112
#      tokens; bf16, fp32), then on rope (phi-3-mini and qwen2.5-7b; 1 / 300 / 1024 / 3900
#      tokens; bf16, fp16);
#   2. the whole GPU suite but the model test (-n 15);
#   3. item 60's rope_lanes_ab.py on phi-3-mini at 1-3036 tokens (plan: 6 lanes; lib: the
#      table emptied, main's plan) and item 53's rope_token_prefill.py on qwen2.5-7b at
#      528-8192 (rule: the decode heads; lib: the wide kernel).
# Results: $OUT/san_norm/ and $OUT/all/ (summary.txt, results.tar.gz, pytest_gpu.log).
cd "$(dirname "$0")/../../.."
. bench/results/2026-12-07_issue11-item63/patched_tree.sh
D=bench/results/2026-12-07_issue11-item64
export CUPYKERN_COMMIT="${CUPYKERN_COMMIT:-unknown}+issue11-all"
patched_tree all $D/issue11-all
cd /tmp/branch-all || exit 2
OUT=$BASE_OUT/san_norm SANITIZE=1 SANITIZE_FAMILIES=norm TESTS= BENCHES= DEADLINE_S=${NORM_S:-110} \
  SANITIZE_ARGS="--num-tokens 1,1024,2112 --dtypes bf16,fp32 --models llama-3.1-70b" bash bench/gpu_session.sh
OUT=$BASE_OUT/all SANITIZE=1 SANITIZE_FAMILIES=rope DEADLINE_S=$(( ${DEADLINE_S:-585} - SECONDS )) \
  SANITIZE_ARGS="--num-tokens 1,300,1024,3900 --dtypes bf16,fp16 --models phi-3-mini,qwen2.5-7b" \
  TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" \
  BENCHES="bench/results/2026-12-07_issue11-item60/rope_lanes_ab.py --tag c64l --sizes 1,16,64,256,527,528,1024,1584,2300,3035,3036;bench/results/2026-12-06_issue11-item53/rope_token_prefill.py --models qwen2.5-7b --sizes 528,1024,1584,2300,3036,4091,4092,8192 --tag c64q" \
  bash bench/gpu_session.sh
