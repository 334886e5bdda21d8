#!/usr/bin/env bash
# One GPU session in one call: the GPU test suite, the benchmarks, sweeps and peers,
# results under $OUT.
#
#   bash bench/gpu_session.sh                 # all GPU tests + every bench
#   TESTS="tests/test_norm.py" BENCHES="bench/bench_norm.py --quick" PYTEST_ARGS="-n 8" bash bench/gpu_session.sh
#   TESTS= BENCHES= SWEEPS="--json sweep.json;silu_and_mul --vecs-per-thread 1,2,4" bash bench/gpu_session.sh
#   TESTS= BENCHES= PEERS="" bash bench/gpu_session.sh   # the README's peers table (carry .whl for Liger)
#   TESTS= BENCHES= PEERS="--models llama-3.1-8b --num-tokens 1,64,4096,16384" bash bench/gpu_session.sh
#
# TESTS: pytest arguments (empty: no tests). BENCHES: ';'-separated bench scripts with
# their arguments (newlines count as spaces, as in bench/ab.sh's AB_JOBS). SWEEPS:
# ';'-separated argument lists of `cupykern sweep` (newlines the same); a relative
# --json/--csv path lands in the results folder. PEERS: arguments of bench/peers.py
# (unset: not run; empty: its defaults, llama-3.1-8b and -70b x 8 ops x 1 to 16384 tokens,
# every formulation, static torch.compile compiled ahead in parallel: about 6 minutes). SANITIZE=1 runs bench/sanitize.py under compute-sanitizer memcheck and
# racecheck (SANITIZE_FAMILIES: a comma-separated subset; SANITIZE_ARGS: more of its options, e.g. "--dtypes fp16"). Each step gets what is left of DEADLINE_S seconds (default 570,
# inside the device tool's 600 s), so a slow step cannot cost the others' results.
#
# Runs from the checkout with the machine's python3 and packages (cupy, numpy,
# ml_dtypes, pytest, click, rich); wheels carried in .whl/ are installed to /tmp/site
# first. Every log and JSON goes to a results folder packed into $OUT/results.tar.gz
# (the device tool returns at most 8 files); the pytest log and a summary are also
# copied to $OUT as they are. Bench JSON also goes to bench/results/.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
RES=$(mktemp -d /tmp/cupykern-results.XXXX)
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupykern-kernel-cache}
# tests/test_llm.py needs the SmolLM2 file, which bench/llm_on_gpu.sh carries to the machine.
TESTS=${TESTS-"tests --ignore=tests/test_llm.py"}
BENCHES=${BENCHES-"bench/bench_norm.py --quick;bench/bench_activation.py;bench/bench_rope.py"}
SWEEPS=${SWEEPS-}
PYTEST_ARGS=${PYTEST_ARGS:-}
DEADLINE_S=${DEADLINE_S:-570}

status=0
summary() { echo "$*" | tee -a "$RES/summary.txt"; }
left() { echo $((DEADLINE_S - SECONDS > 5 ? DEADLINE_S - SECONDS : 5)); }
# Runs "$@" with what is left of the deadline, output to the terminal and to $RES/$name.log.
step() {
  local name=$1; shift
  local start=$SECONDS rc
  timeout "$(left)" "$@" 2>&1 | tee "$RES/$name.log"
  rc=$?
  summary "$name: rc $rc in $((SECONDS - start)) s ($*)"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
pack() {
  [ -n "${clock_log:-}" ] && kill "$clock_log" 2>/dev/null
  cp "$RES/summary.txt" "$OUT/" 2>/dev/null
  cp "$RES/pytest_gpu.log" "$OUT/" 2>/dev/null
  tar czf "$OUT/results.tar.gz" -C "$RES" .
  rm -rf "$RES"
}
trap pack EXIT
# The GPU's clocks, power and throttle reasons every 250 ms (clocks.csv), to tell a
# clock change from other causes when times move within a run (bench/results/NOTES.md,
# item 18: the 0.17 us of a torch graph's state, the clocks steady).
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 250 > "$RES/clocks.csv" 2>&1 &
clock_log=$!

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; \
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"; \
  echo "commit ${CUPYKERN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"; } 2>&1 | tee "$RES/environment.txt"

if [ -n "${GOLDEN:-}" ]; then
  step golden_old env PYTHONPATH="$GOLDEN:$PYTHONPATH" python3 tests/golden_outputs.py --write "$RES/golden_old.json"
  step golden_new python3 tests/golden_outputs.py --write "$RES/golden_new.json"
  step golden_compare python3 -c "
import json, sys
old, new = (json.load(open(sys.argv[i]))['digests'] for i in (1, 2))
changed = sorted(k for k in old if new.get(k) != old[k])
print(len(old), 'cases,', len(changed), 'changed', changed[:20])
sys.exit(1 if changed or set(old) != set(new) else 0)" "$RES/golden_old.json" "$RES/golden_new.json"
  cp "$RES/golden_old.json" "$OUT/" 2>/dev/null
fi

if [ -n "${SANITIZE:-}" ]; then
  for tool in memcheck racecheck; do
    # shellcheck disable=SC2086
    step "sanitize_$tool" /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --error-exitcode 3 python3 bench/sanitize.py \
      ${SANITIZE_FAMILIES:+--families "$SANITIZE_FAMILIES"} ${SANITIZE_ARGS:-}
  done
fi

if [ -n "${TESTS// }" ]; then
  # shellcheck disable=SC2086
  step pytest_gpu python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 --durations=10 $PYTEST_ARGS $TESTS
fi

IFS=';' read -ra bench_list <<< "$(tr '\n' ' ' <<< "$BENCHES")"  # a command wrapped over lines: one list
j=0
for bench in "${bench_list[@]}"; do
  [ -n "${bench// }" ] || continue
  bench=${bench#"${bench%%[! ]*}"}  # leading spaces off, for the step's name
  j=$((j + 1))
  # shellcheck disable=SC2086
  step "bench_${j}_$(basename "${bench%% *}" .py)" python3 $bench --out "$RES"
done

IFS=';' read -ra sweep_list <<< "$(tr '\n' ' ' <<< "$SWEEPS")"  # a command wrapped over lines: one list
i=0
for args in "${sweep_list[@]}"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  (cd "$RES" && step "sweep_$i" python3 -m cupykern.cli sweep $args) || status=1
done

if [ -n "${PEERS+set}" ]; then
  # shellcheck disable=SC2086
  step peers python3 bench/peers.py --out "$RES" $PEERS
fi
summary "exit status $status"
exit $status
