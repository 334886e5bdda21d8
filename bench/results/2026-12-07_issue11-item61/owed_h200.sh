#!/usr/bin/env bash
# NOTES item 61: the owed H200 work in two warm calls, main's tree and the branches' trees
# side by side. Before the calls, here: `bash bench/results/2026-12-07_issue11-item61/owed_h200.sh
# trees` archives each branch's cupykern/ kernels_cu/ tests/ bench/ (not bench/results)
# and pyproject.toml into ab/NAME through bench/ab.sh's trees (untracked: the device call
# copies it; delete it before committing), with the branch's own result scripts it runs.
# Then, on the device
# (kind nvidia-h200, carry .whl, PEERS unset, CUPYKERN_COMMIT set):
#   PART=A  the peers table (main), rms_rows_probe.py (main: share4 is branch
#           rms-decode-layout-filled's plan for 8b and 70b), rope_lanes_ab.py (6-lanes tree)
#   PART=B  the branches' GPU tests and sanitizers: rms-decode-layout-filled (norm),
#           rope-token-6-lanes (rope; phi's shapes), then main's whole GPU suite if time is left
# Each part stops on any card but an H200 (exit 3); each step has its share of DEADLINE_S.
set -u
unset PEERS
cd "$(dirname "$0")/../../.."
BRANCHES="rms-decode-layout-filled rope-token-6-lanes"
if [ "${1:-}" = trees ]; then  # bench/ab.sh's trees, with each branch's tests and benches
  AB_PATHS="cupykern kernels_cu tests bench pyproject.toml :!bench/results" bash bench/ab.sh trees $BRANCHES || exit
  mkdir -p ab/rope-token-6-lanes/bench/results/2026-12-07_issue11-item60
  cp bench/results/2026-12-07_issue11-item60/rope_lanes_ab.py ab/rope-token-6-lanes/bench/results/2026-12-07_issue11-item60/
  exit 0
fi
nvidia-smi -L
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo NOT-AN-H200; exit 3; }
BASE_OUT=${OUT:-$PWD/.out}
DEADLINE_S=${DEADLINE_S:-585}
left() { echo $((DEADLINE_S - SECONDS > 5 ? DEADLINE_S - SECONDS : 5)); }
share() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }
in_tree() {  # in_tree BRANCH OUTNAME ENV... : gpu_session.sh in that branch's archived tree,
  local b=$1 name=$2; shift 2  # with main's carried wheels (platformdirs, Liger)
  ln -sfn ../../.whl "ab/$b/.whl"
  (cd "ab/$b" && env OUT="$BASE_OUT/$name" CUPYKERN_COMMIT="$(cat COMMIT)" "$@" bash bench/gpu_session.sh)
}
P=bench/results/2026-12-07_issue11-item61/rms_rows_probe.py
S=384,768,1024,1536,2048,3072,4096,6144
case "${PART:-A}" in
A)
  OUT=$BASE_OUT/peers TESTS= BENCHES= PEERS="" DEADLINE_S=$(share 445) bash bench/gpu_session.sh
  OUT=$BASE_OUT/probe TESTS= DEADLINE_S=$(share 80) \
    BENCHES="$P --tag h61d --no-liger --rounds 5 --models llama-3.1-8b --dtypes bf16,fp32 --sizes $S;$P --tag h61m --no-liger --rounds 5 --models llama-3.1-70b --sizes $S" \
    bash bench/gpu_session.sh
  in_tree rope-token-6-lanes lanes TESTS= DEADLINE_S="$(share 50)" \
    BENCHES="bench/results/2026-12-07_issue11-item60/rope_lanes_ab.py --tag h61"
  ;;
B)
  in_tree rms-decode-layout-filled rms TESTS="tests/test_norm.py tests/test_reduction_tree.py tests/test_plans.py" \
    PYTEST_ARGS="-n 15" SANITIZE=1 SANITIZE_FAMILIES=norm \
    SANITIZE_ARGS="--num-tokens 1,1024,2112 --dtypes bf16,fp32 --models llama-3.1-70b" BENCHES= DEADLINE_S="$(share 170)"
  in_tree rope-token-6-lanes lanes-tests TESTS="tests/test_rope_layouts.py tests/test_rope.py" PYTEST_ARGS="-n 15" \
    SANITIZE=1 SANITIZE_FAMILIES=rope SANITIZE_ARGS="--models phi-3-mini --num-tokens 1,300 --dtypes bf16" \
    BENCHES= DEADLINE_S="$(share 150)"
  OUT=$BASE_OUT/suite TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= \
    DEADLINE_S=$(left) bash bench/gpu_session.sh
  ;;
esac
