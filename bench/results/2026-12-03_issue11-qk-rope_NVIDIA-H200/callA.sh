#!/usr/bin/env bash
# Call A (NOTES item 31): the GPU suite at HEAD (ce234a4's out-of-place M-RoPE test had
# not run on the GPU), then qk_iso.py: hand-written qk_rms_norm_rope kernels of
# apply_rope_wide_kernel's structure against the library's (bf16, 8b and 70b, 1-16384).
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -2
echo "suite $((SECONDS - S)) s" | tee -a $OUT/calls.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 $D/qk_iso.py > $OUT/qk_iso.log 2>&1
echo "qk_iso rc $?"; grep -v "^8b\|^70b" $OUT/qk_iso.log | tail -45
grep " lib \|H[0-9].*minb1 block" $OUT/qk_iso.log | grep "hoist1 mask1\| lib " | cut -c1-80
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
