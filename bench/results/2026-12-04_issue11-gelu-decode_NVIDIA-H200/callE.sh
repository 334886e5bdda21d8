#!/usr/bin/env bash
# Call E (NOTES item 36): compute-sanitizer memcheck and racecheck on sized_sanitize.py
# (every sized instantiation the heuristics pick for silu and both gelus at 1-16 tokens),
# then host time per call at HEAD. Packed into $OUT/callE.tar.gz.
S=$SECONDS
D=bench/results/2026-12-04_issue11-gelu-decode_NVIDIA-H200
R=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
for tool in memcheck racecheck; do
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $D/sized_sanitize.py \
    > $R/sized_$tool.log 2>&1
  echo "sanitize $tool rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
  grep -c "sized ok" $R/sized_$tool.log; tail -3 $R/sized_$tool.log
done
timeout 120 python3 bench/bench_host_overhead.py --calls 20000 --out $R > $R/host.log 2>&1
echo "host rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
grep -E "^│ (silu_and_mul|gelu_and_mul|apply_rope|qk_rms_norm_rope|rms_norm|fused_add_rms_norm) " $R/host.log | cut -c1-150
tar czf $OUT/callE.tar.gz -C $R .
