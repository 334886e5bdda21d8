#!/usr/bin/env bash
# Call A (NOTES item 31): qk_iso.py (hand-written qk_rms_norm_rope kernels of
# apply_rope_wide_kernel's structure, 9e2a362's library kernel and this tree's, bf16, 8b
# and 70b, 1-16384 tokens), then the GPU suite at this tree.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-qk-rope_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
PYTHONPATH=/tmp/site:$PWD OUT=$OUT python3 $D/qk_iso.py > $OUT/qk_iso.log 2>&1
echo "qk_iso rc $?"; grep -v "^8b\|^70b" $OUT/qk_iso.log | grep -v "^qk_x" | tail -5
python3 - $OUT/qk_iso.json <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1]))
by = collections.defaultdict(list)
for p in r["points"]:
    by[p["model"], p["num_tokens"]].append(p)
for key, ps in by.items():
    best = min((p for p in ps if p["kernel"].startswith("H")), key=lambda p: p["us"])
    row = " ".join(f"{p['kernel']}={p['us']:.2f}" for p in ps if not p["kernel"].startswith("H"))
    bad = [p["kernel"] for p in ps if p.get("bitwise_ok") is False]
    print(key, row, f"| best {best['kernel']}={best['us']:.2f} ({best['pct_copy']:.1f} %)", "| bits differ:", bad)
PY
echo "qk_iso $((SECONDS - S)) s" | tee -a $OUT/calls.txt
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=300 bash bench/gpu_session.sh > $OUT/suite.log 2>&1
grep -E "passed|failed" $OUT/pytest_gpu.log | tail -3
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
