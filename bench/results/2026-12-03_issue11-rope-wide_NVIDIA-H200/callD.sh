#!/usr/bin/env bash
# Call D (NOTES item 30): the GPU suite at the commit with the kInPlace instantiation,
# then compute-sanitizer memcheck and racecheck on sanitize_rope.py (both instantiations,
# out-of-range positions, partial rotary_dim, M-RoPE, 1 / 3 / 600 tokens) and on
# bench/sanitize.py --families rope.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-wide_NVIDIA-H200
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
tail -3 $OUT/suite.log
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache
for tool in memcheck racecheck; do
  timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $D/sanitize_rope.py \
    > $OUT/sanitize_rope_$tool.log 2>&1
  echo "sanitize_rope $tool rc $?"; tail -3 $OUT/sanitize_rope_$tool.log
done
for tool in memcheck racecheck; do
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope --num-tokens 1,3,600 --dtypes bf16,fp16,fp32 > $OUT/sanitize_family_$tool.log 2>&1
  echo "sanitize rope family $tool rc $?"; tail -2 $OUT/sanitize_family_$tool.log
done
echo "callD $((SECONDS - S)) s" | tee -a $OUT/calls.txt
