#!/usr/bin/env bash
# NOTES item 63: the parked branches' GPU tests, sanitizers and A/Bs in one call (any card),
# each in its own copy of this tree with its patch applied (git apply), from the repository
# root (carry .whl; CUPYKERN_COMMIT set to main's sha: the results say "<sha>+patch").
# BRANCHES (default all three, in this order) picks; each gets an equal share of what is
# left of DEADLINE_S.
#   rms    rms-decode-layout-filled (item 62's patch): tests/test_norm.py,
#          test_reduction_tree.py, test_plans.py (-n 15); compute-sanitizer memcheck and
#          racecheck on the norm family, 70b, 1 / 1024 / 2112 tokens, bf16 and fp32.
#   rope6  rope-token-6-lanes: tests/test_rope_layouts.py, test_rope.py (-n 15); the
#          sanitizers on rope, phi-3-mini, 1 / 300 tokens, bf16; rope_lanes_ab.py (item 60:
#          the plan against the plan without 6 lanes, phi-3-mini; tag c63l).
#   ropeD  rope-decode-heads-only: the same two test files; the sanitizers on rope,
#          qwen2.5-7b, 1024 / 3900 tokens, bf16 and fp16; item 53's rope_token_prefill.py on
#          qwen2.5-7b at 528-8192 (rule: the branch's plan; lib: the wide kernel; tag c63q).
cd "$(dirname "$0")/../../.."
D=bench/results/2026-12-07_issue11-item63
. $D/patched_tree.sh
DEADLINE_S=${DEADLINE_S:-585}
BRANCHES=${BRANCHES:-"rms rope6 ropeD"}
ROPE_TESTS="tests/test_rope_layouts.py tests/test_rope.py"
export CUPYKERN_COMMIT="${CUPYKERN_COMMIT:-unknown}+patch"
set -- $BRANCHES
while [ $# -gt 0 ]; do
  name=$1; shift
  case $name in
    rms) patch=bench/results/2026-12-07_issue11-item62/rms-decode-layout-filled
         env=(TESTS="tests/test_norm.py tests/test_reduction_tree.py tests/test_plans.py" SANITIZE_FAMILIES=norm
              SANITIZE_ARGS="--num-tokens 1,1024,2112 --dtypes bf16,fp32 --models llama-3.1-70b" BENCHES=) ;;
    rope6) patch=$D/rope-token-6-lanes
           env=(TESTS="$ROPE_TESTS" SANITIZE_FAMILIES=rope SANITIZE_ARGS="--num-tokens 1,300 --dtypes bf16 --models phi-3-mini"
                BENCHES="bench/results/2026-12-07_issue11-item60/rope_lanes_ab.py --tag c63l") ;;
    ropeD) patch=$D/rope-decode-heads-only
           env=(TESTS="$ROPE_TESTS" SANITIZE_FAMILIES=rope
                SANITIZE_ARGS="--num-tokens 1024,3900 --dtypes bf16,fp16 --models qwen2.5-7b"
                BENCHES="bench/results/2026-12-06_issue11-item53/rope_token_prefill.py --models qwen2.5-7b --sizes 528,1024,1584,2300,3036,4091,4092,8192 --tag c63q") ;;
    *) echo "unknown branch $name"; exit 2 ;;
  esac
  dir=/tmp/branch-$name
  patched_tree $name $patch
  share=$(( (DEADLINE_S - SECONDS) / ($# + 1) ))
  (cd "$dir" && env OUT="$BASE_OUT/$name" PYTEST_ARGS="-n 15" SANITIZE=1 DEADLINE_S=$share "${env[@]}" bash bench/gpu_session.sh)
done
