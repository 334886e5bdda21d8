#!/usr/bin/env bash
# Call A (NOTES item 32), one call on 287 s of device time: the GPU tests of
# qk_rms_norm_rope (with the golden bits and the random calls), compute-sanitizer memcheck
# and racecheck on item 31's sanitize_qk.py (2 / 3 / 4 heads a thread, pass-through dims
# or not, head_dim 256, out-of-range positions, the scalar path, 1 / 3 / 600 tokens), then
# qk_prev.py (this tree's wide kernel against bb81c7e's) at 1 / 64 / 4096 / 16384 tokens.
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-32bit_NVIDIA-H200
SAN=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200/sanitize_qk.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests --ignore=tests/test_llm.py \
  -k "qk or bit_identical_to_the_recorded or random_calls_match" > $OUT/pytest_qk.log 2>&1
echo "pytest rc $?"; tail -2 $OUT/pytest_qk.log; echo "tests $((SECONDS - S)) s" | tee -a $OUT/calls.txt
for tool in memcheck racecheck; do
  timeout 70 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $SAN \
    > $OUT/sanitize_qk_$tool.log 2>&1
  echo "sanitize_qk $tool rc $?"; tail -3 $OUT/sanitize_qk_$tool.log
  echo "$tool $((SECONDS - S)) s" | tee -a $OUT/calls.txt
done
SIZES=1,64,4096,16384 OUT=$OUT timeout 80 python3 $D/qk_prev.py > $OUT/qk_prev.log 2>&1
echo "qk_prev rc $?"; grep -c DIFFER $OUT/qk_prev.log; grep " n=" $OUT/qk_prev.log | awk '{print $1,$2,$3,$5}' | paste -sd' ' | fold -w 2000
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
