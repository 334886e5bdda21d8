#!/usr/bin/env bash
# Call B (NOTES item 33): the whole GPU suite with the regridded qk_rms_norm_rope, its new
# GPU test (3000 tokens: capped grids) under compute-sanitizer memcheck and racecheck, and
# grid_waves.py again ("lib" is now the occupancy-based grid), then qk_heads.py (3 / 4 / 5
# heads a thread in 1 and 2 waves of their own occupancy).
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-grid_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
timeout 260 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -n 15 tests --ignore=tests/test_llm.py \
  > $OUT/pytest_gpu.log 2>&1
echo "pytest rc $?"; tail -3 $OUT/pytest_gpu.log; echo "tests $((SECONDS - S)) s" | tee -a $OUT/calls.txt
for tool in memcheck racecheck; do
  timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 -m pytest -m gpu -q \
    -p no:cacheprovider tests/test_rope_layouts.py -k grid_is_whole_waves > $OUT/sanitize_grid_$tool.log 2>&1
  echo "sanitize $tool rc $?"; grep -E "passed|failed|SUMMARY" $OUT/sanitize_grid_$tool.log | tail -3
  echo "$tool $((SECONDS - S)) s" | tee -a $OUT/calls.txt
done
SIZES=1024,4096,16384 OUT=$OUT timeout 120 python3 $D/grid_waves.py > $OUT/grid_waves.log 2>&1
echo "grid_waves rc $?"; grep -c DIFFER $OUT/grid_waves.log
grep " n=" $OUT/grid_waves.log | grep -v plan | awk '{print $1,$2,$3,$4,$6,$7,$9}' | paste -sd';' | fold -w 3000
OUT=$OUT timeout 150 python3 $D/qk_heads.py > $OUT/qk_heads.log 2>&1
echo "qk_heads rc $?"; grep -c DIFFER $OUT/qk_heads.log
grep " n=" $OUT/qk_heads.log | awk '{print $1,$2,$3,$4,$5,$9,$11}' | paste -sd';' | fold -w 3000
echo "callB $((SECONDS - S)) s" | tee -a $OUT/calls.txt
