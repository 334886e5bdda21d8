#!/usr/bin/env bash
# Call A (NOTES item 33): the whole GPU suite at this tree (owed since item 32's kernel),
# then grid_waves.py (the wide RoPE kernels' grid against the blocks an SM holds).
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-grid_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
git rev-parse --short HEAD 2>/dev/null | tee $OUT/commit.txt
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -n 15 tests --ignore=tests/test_llm.py \
  > $OUT/pytest_gpu.log 2>&1
echo "pytest rc $?"; tail -3 $OUT/pytest_gpu.log; echo "tests $((SECONDS - S)) s" | tee -a $OUT/calls.txt
OUT=$OUT timeout 200 python3 $D/grid_waves.py > $OUT/grid_waves.log 2>&1
echo "grid_waves rc $?"; grep -c DIFFER $OUT/grid_waves.log
grep " n=" $OUT/grid_waves.log | grep -v plan | awk '{print $1,$2,$3,$4,$6,$7,$9}' | paste -sd';' | fold -w 3000
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
