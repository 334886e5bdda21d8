#!/usr/bin/env bash
# Call C (NOTES item 31): qk_lib_variants.py (the library kernel patched: 32-bit sizes,
# no pass-through dims, both), then the GPU suite at this tree (qk_rms_norm_rope's
# prefill heads by the fullest block: 70b 3 a thread).
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
PYTHONPATH=/tmp/site:$PWD OUT=$OUT python3 $D/qk_lib_variants.py > $OUT/qk_lib_variants.log 2>&1
echo "qk_lib_variants rc $?"; grep -v "^qk_" $OUT/qk_lib_variants.log | tail -34
echo "variants $((SECONDS - S)) s" | tee -a $OUT/calls.txt
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -3
echo "callC $((SECONDS - S)) s" | tee -a $OUT/calls.txt
