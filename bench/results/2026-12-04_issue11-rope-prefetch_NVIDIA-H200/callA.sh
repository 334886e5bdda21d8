#!/usr/bin/env bash
# Call A (NOTES item 35): rope_prefetch.py, then the owed evidence at HEAD: compute-sanitizer
# on the rope family (8b, M-RoPE and SmolLM2 heads at 1, 3, 600 tokens) and the whole GPU suite.
S=$SECONDS
D=bench/results/2026-12-04_issue11-rope-prefetch_NVIDIA-H200
export PYTHONPATH=$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
R=$(mktemp -d)
OUT=$R timeout 200 python3 $D/rope_prefetch.py > $R/rope_prefetch.log 2>&1
echo "rope_prefetch rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt; grep -c DIFFER $R/rope_prefetch.log
grep -E "n= 4096|n=16384" $R/rope_prefetch.log | cut -c1-130
tar czf $OUT/callA.tar.gz -C $R .
SANITIZE=1 SANITIZE_FAMILIES=rope SANITIZE_ARGS="--num-tokens 1,3,600 --dtypes bf16,fp16,fp32 --models smollm2-135m" \
  BENCHES= PYTEST_ARGS="-n 15" DEADLINE_S=$((585 - SECONDS)) bash bench/gpu_session.sh > /dev/null 2>&1
echo "gpu_session rc $? $((SECONDS - S)) s"; cat $OUT/summary.txt; tail -3 $OUT/pytest_gpu.log
