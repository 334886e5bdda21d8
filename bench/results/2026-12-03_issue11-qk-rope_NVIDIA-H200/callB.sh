#!/usr/bin/env bash
# Call B (NOTES item 31): compute-sanitizer memcheck and racecheck on sanitize_qk.py
# (qk_rms_norm_rope's wide kernel at 2 / 3 / 4 heads a thread, out-of-range positions,
# partial rotary_dim, head_dim 256, the scalar path, 1 / 3 / 600 tokens) and on
# bench/sanitize.py --families rope.
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache
python3 $D/sanitize_qk.py > $OUT/sanitize_qk_plain.log 2>&1; echo "sanitize_qk (no tool) rc $?"; tail -1 $OUT/sanitize_qk_plain.log
for tool in memcheck racecheck; do
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $D/sanitize_qk.py \
    > $OUT/sanitize_qk_$tool.log 2>&1
  echo "sanitize_qk $tool rc $?"; tail -3 $OUT/sanitize_qk_$tool.log
done
for tool in memcheck racecheck; do
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope --num-tokens 1,3,600 --dtypes bf16,fp16,fp32 > $OUT/sanitize_family_$tool.log 2>&1
  echo "sanitize rope family $tool rc $?"; tail -2 $OUT/sanitize_family_$tool.log
done
echo "callB $((SECONDS - S)) s" | tee -a $OUT/calls.txt
