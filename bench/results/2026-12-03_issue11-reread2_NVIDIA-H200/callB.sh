#!/usr/bin/env bash
# Call B (NOTES item 29): the GPU suite at the commit taking the rereading pass 2 with
# both loads first, then compute-sanitizer memcheck and racecheck on the rereading
# kernels' small calls (the last session's sanitize_reread.py) and on bench/sanitize.py
# --families norm at 3 and 8192 tokens.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
tail -3 $OUT/suite.log
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache
for tool in memcheck racecheck; do
  timeout 110 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 \
    bench/results/2026-12-02_issue11-reread_NVIDIA-H200/sanitize_reread.py > $OUT/sanitize_reread_$tool.log 2>&1
  echo "sanitize_reread $tool rc $?"; tail -3 $OUT/sanitize_reread_$tool.log
done
for tool in memcheck racecheck; do
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families norm --num-tokens 3,8192 --dtypes bf16,fp16,fp32 > $OUT/sanitize_norm_$tool.log 2>&1
  echo "sanitize norm $tool rc $?"; tail -2 $OUT/sanitize_norm_$tool.log
done
echo "callB $((SECONDS - S)) s" | tee -a $OUT/calls.txt
