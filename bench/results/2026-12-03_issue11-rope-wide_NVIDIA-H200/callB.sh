#!/usr/bin/env bash
# Call B (NOTES item 30): the tree with apply_rope_wide_kernel's kInPlace instantiation,
# alone and with threads_per_head 8 at compile time (tph8), in place and out of place,
# beside the hand-written kernel; then the RoPE GPU tests.
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-wide_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
SETS=base,tph8 INPLACE=1,0 python3 $D/rope_wide_lib.py 2>&1 | tee $OUT/rope_wide_lib.log
cp $OUT/rope_wide_lib.json $OUT/rope_wide_lib_B.json 2>/dev/null
python3 -m pytest -q -m gpu -n 15 -p no:cacheprovider tests/test_rope.py tests/test_rope_layouts.py 2>&1 | tail -5 | tee $OUT/pytest_rope.log
echo "callB $((SECONDS - S)) s" | tee -a $OUT/calls.txt
