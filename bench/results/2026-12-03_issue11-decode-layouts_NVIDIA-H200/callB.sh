#!/usr/bin/env bash
# Call B (NOTES item 34): qk_rms_norm_rope's wide kernel in blocks of 1, 2 or 4 tokens
# (qk_tokens.py); the whole GPU suite with apply_rope's wide blocks of one token
# (ROPE_WIDE_MOST_TOKENS_PER_BLOCK = 1); bench/sanitize.py's rope family at 1, 3 and 600
# tokens (600: the prefill plan) under compute-sanitizer memcheck and racecheck.
S=$SECONDS
D=bench/results/2026-12-03_issue11-decode-layouts_NVIDIA-H200
export PYTHONPATH=$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
R=$(mktemp -d)
OUT=$R timeout 150 python3 $D/qk_tokens.py > $R/qk_tokens.log 2>&1
echo "qk_tokens rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt; grep -c DIFFER $R/qk_tokens.log
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -n 15 tests --ignore=tests/test_llm.py \
  > $R/pytest_gpu.log 2>&1
echo "pytest rc $?"; tail -3 $R/pytest_gpu.log; echo "tests $((SECONDS - S)) s" | tee -a $R/calls.txt
for tool in memcheck racecheck; do
  timeout 80 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope --num-tokens 1,3,600 --dtypes bf16,fp16,fp32 > $R/sanitize_rope_$tool.log 2>&1
  echo "sanitize $tool rc $?"; grep -cE "ok|passed" $R/sanitize_rope_$tool.log; grep -E "SUMMARY|fail" $R/sanitize_rope_$tool.log | tail -3
  echo "$tool $((SECONDS - S)) s" | tee -a $R/calls.txt
done
cp $R/pytest_gpu.log $OUT/
tar czf $OUT/callB.tar.gz -C $R .
