#!/usr/bin/env bash
# Call C (NOTES item 30): the kInPlace tree's wide kernel walking tokens grid-stride with
# the next position requested ahead (rope_prefetch.py), every heads-per-thread choice.
S=$SECONDS
D=bench/results/2026-12-03_issue11-rope-wide_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 400 python3 $D/rope_prefetch.py 2>&1 | tee $OUT/rope_prefetch.log
echo "callC $((SECONDS - S)) s" | tee -a $OUT/calls.txt
