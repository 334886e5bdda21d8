#!/usr/bin/env bash
# Call C (NOTES item 33): the GPU tests of qk_rms_norm_rope (5 heads a thread for llama-3.1-8b
# at prefill) with the golden bits, sanitize_qk.py (item 31) under compute-sanitizer memcheck
# and racecheck, then the whole peers run (bench/gpu_session.sh, README's table) of a349b3e.
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-grid_NVIDIA-H200
SAN=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200/sanitize_qk.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_rope_layouts.py tests/test_rope.py \
  tests/test_golden.py tests/test_property.py -k "qk or bit_identical_to_the_recorded or random_calls_match" \
  > $OUT/pytest_qk.log 2>&1
echo "pytest rc $?"; tail -2 $OUT/pytest_qk.log; echo "tests $((SECONDS - S)) s" | tee -a $OUT/calls.txt
for tool in memcheck racecheck; do
  timeout 45 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $SAN \
    > $OUT/sanitize_qk_$tool.log 2>&1
  echo "sanitize_qk $tool rc $?"; tail -3 $OUT/sanitize_qk_$tool.log
  echo "$tool $((SECONDS - S)) s" | tee -a $OUT/calls.txt
done
CUPYKERN_COMMIT=a349b3e TESTS= BENCHES= PEERS="" DEADLINE_S=$((590 - (SECONDS - S))) OUT=$OUT bash bench/gpu_session.sh \
  > $OUT/session.log 2>&1
echo "peers rc $?"; tail -5 $OUT/session.log; cp bench/results/*_peers_*_a349b3e.* $OUT/ 2>/dev/null
echo "callC $((SECONDS - S)) s" | tee -a $OUT/calls.txt
