#!/usr/bin/env bash
# Call A (NOTES item 32): qk_prev.py (this tree's qk_rms_norm_rope wide kernel against
# bb81c7e's), the GPU suite at this tree, then compute-sanitizer memcheck and racecheck on
# item 31's sanitize_qk.py (2 / 3 / 4 heads a thread, pass-through dims or not, head_dim
# 256, out-of-range positions, the scalar path) and on bench/sanitize.py --families rope.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-32bit_NVIDIA-H200
SAN=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200/sanitize_qk.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
PYTHONPATH=/tmp/site:$PWD OUT=$OUT python3 $D/qk_prev.py > $OUT/qk_prev.log 2>&1
echo "qk_prev rc $?"; grep -v " n=" $OUT/qk_prev.log | tail -12; grep -c DIFFER $OUT/qk_prev.log
python3 - $OUT/qk_prev.json <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1]))
by = collections.defaultdict(lambda: collections.defaultdict(list))
for p in r["points"]:
    by[p["model"], p["num_tokens"]][p["kernel"]].append(p["us"])
for (m, n), ks in by.items():
    prev, new = min(ks["prev"]), min(ks["new"])
    print(f"{m:8s} {n:6d} prev {'/'.join(f'{x:.2f}' for x in ks['prev'])} new {'/'.join(f'{x:.2f}' for x in ks['new'])} "
          f"lib {ks['lib'][0]:.2f}  new/prev {new / prev:.3f}")
PY
echo "qk_prev $((SECONDS - S)) s" | tee -a $OUT/calls.txt
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -3
echo "suite $((SECONDS - S)) s" | tee -a $OUT/calls.txt
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache
python3 $SAN > $OUT/sanitize_qk_plain.log 2>&1; echo "sanitize_qk (no tool) rc $?"; tail -1 $OUT/sanitize_qk_plain.log
for tool in memcheck racecheck; do
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 $SAN \
    > $OUT/sanitize_qk_$tool.log 2>&1
  echo "sanitize_qk $tool rc $?"; tail -3 $OUT/sanitize_qk_$tool.log
done
for tool in memcheck racecheck; do
  timeout 90 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope --num-tokens 1,3,600 --dtypes bf16,fp16,fp32 > $OUT/sanitize_family_$tool.log 2>&1
  echo "sanitize rope family $tool rc $?"; tail -2 $OUT/sanitize_family_$tool.log
done
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
