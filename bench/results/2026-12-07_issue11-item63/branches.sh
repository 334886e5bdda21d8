#!/usr/bin/env bash
# NOTES item 63: the two parked branches' GPU tests and sanitizers in one call (any card),
# each in its own copy of this tree with its patch applied (git apply), from the repository
# root (carry .whl; CUPYKERN_COMMIT set to main's sha; each branch's results say "+patch").
#   rms-decode-layout-filled (item 62's patch): tests/test_norm.py, test_reduction_tree.py,
#     test_plans.py (-n 15); compute-sanitizer memcheck and racecheck on the norm family, 70b,
#     1 / 1024 / 2112 tokens, bf16 and fp32 (item 61's call 12).
#   rope-token-6-lanes (this item's patch): tests/test_rope_layouts.py, test_rope.py (-n 15);
#     the sanitizers on rope, phi-3-mini, 1 / 300 tokens, bf16 (item 60's call 11); then
#     rope_lanes_ab.py (item 60: the plan against the plan without 6 lanes, phi-3-mini).
set -u
unset PEERS
cd "$(dirname "$0")/../../.."
nvidia-smi -L
BASE_OUT=${OUT:-$PWD/.out}
DEADLINE_S=${DEADLINE_S:-585}
HERE=$PWD
D=bench/results/2026-12-07_issue11-item63
branch() {  # name patch-glob: a copy of the tree with the patch applied, printed
  local dir=/tmp/branch-$1
  rm -rf "$dir" && mkdir -p "$dir" && tar -C "$HERE" --exclude=./.out -cf - . | tar -C "$dir" -xf - &&
    (cd "$dir" && git apply $2 >&2) && echo "$dir"
}
RMS=$(branch rms "$HERE/bench/results/2026-12-07_issue11-item62/rms-decode-layout-filled/0001-*.patch") || exit 2
ROPE=$(branch rope6 "$HERE/$D/rope-token-6-lanes/0001-*.patch") || exit 2
export CUPYKERN_COMMIT="${CUPYKERN_COMMIT:-unknown}+patch"
(cd "$RMS" && OUT=$BASE_OUT/rms TESTS="tests/test_norm.py tests/test_reduction_tree.py tests/test_plans.py" \
  PYTEST_ARGS="-n 15" SANITIZE=1 SANITIZE_FAMILIES=norm \
  SANITIZE_ARGS="--num-tokens 1,1024,2112 --dtypes bf16,fp32 --models llama-3.1-70b" BENCHES= \
  DEADLINE_S=$(( (DEADLINE_S - SECONDS) / 2 )) bash bench/gpu_session.sh)
(cd "$ROPE" && OUT=$BASE_OUT/rope6 TESTS="tests/test_rope_layouts.py tests/test_rope.py" PYTEST_ARGS="-n 15" \
  SANITIZE=1 SANITIZE_FAMILIES=rope SANITIZE_ARGS="--num-tokens 1,300 --dtypes bf16 --models phi-3-mini" \
  BENCHES="bench/results/2026-12-07_issue11-item60/rope_lanes_ab.py --tag c63l" \
  DEADLINE_S=$((DEADLINE_S - SECONDS)) bash bench/gpu_session.sh)
