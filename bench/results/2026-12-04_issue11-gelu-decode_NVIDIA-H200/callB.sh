#!/usr/bin/env bash
# Call B (NOTES item 36): act_params.py, packed into $OUT/callB.tar.gz.
S=$SECONDS
D=bench/results/2026-12-04_issue11-gelu-decode_NVIDIA-H200
R=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
OUT=$R timeout 560 python3 $D/act_params.py > $R/act_params.log 2>&1
echo "act_params rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
grep -E "torch.compile/this" $R/act_params.log | cut -c1-150; tail -3 $R/act_params.log | cut -c1-300
tar czf $OUT/callB.tar.gz -C $R .
