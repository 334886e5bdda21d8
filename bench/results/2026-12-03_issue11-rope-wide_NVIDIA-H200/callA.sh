#!/usr/bin/env bash
# Call A (NOTES item 30): apply_rope_wide_kernel patched one change at a time against the
# hand-written kernel, through cupykern.apply_rope (bf16, 8b and 70b, 1-16384 tokens).
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-wide_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python3 $D/rope_wide_lib.py 2>&1 | tee $OUT/rope_wide_lib.log
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
