#!/usr/bin/env bash
# One GPU session in one call: the GPU test suite, then the benchmarks, results under $OUT.
#
#   bash bench/gpu_session.sh                 # all GPU tests + every bench
#   TESTS="tests/test_norm.py" BENCHES="bench/bench_norm.py --quick" PYTEST_ARGS="-n 8" bash bench/gpu_session.sh
#
# Runs from the checkout with the machine's python3 and packages (cupy, numpy,
# ml_dtypes, pytest, click, rich); nothing is installed. Logs and JSON go to $OUT
# (default ./.out), JSON also to bench/results/. The device tool returns at most 8 files
# from $OUT: this writes exactly 8 (environment, pytest log, 3 bench logs, 3 JSON).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupykern-kernel-cache}
# tests/test_llm.py needs the SmolLM2 file, which bench/llm_on_gpu.sh carries to the machine.
TESTS=${TESTS:-"tests --ignore=tests/test_llm.py"}
BENCHES=${BENCHES:-"bench/bench_norm.py --quick;bench/bench_activation.py;bench/bench_rope.py"}
PYTEST_ARGS=${PYTEST_ARGS:-}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; \
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; } 2>&1 | tee "$OUT/environment.txt"

status=0
# shellcheck disable=SC2086
python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 --durations=10 $PYTEST_ARGS $TESTS 2>&1 \
  | tee "$OUT/pytest_gpu.log" | grep -E -v '^(\.|s)+ *\[ *[0-9]+%\]$' || status=1

IFS=';' read -ra bench_list <<< "$BENCHES"
for bench in "${bench_list[@]}"; do
  [ -n "${bench// }" ] || continue
  name=$(basename "${bench%% *}" .py)
  # shellcheck disable=SC2086
  python3 $bench --out "$OUT" 2>&1 | tee "$OUT/$name.log" || status=1
done
exit $status
