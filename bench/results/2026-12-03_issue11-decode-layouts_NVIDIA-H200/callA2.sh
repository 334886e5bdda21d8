#!/usr/bin/env bash
# Call A2 (NOTES item 34): call A's rope_layouts.py again (its log did not come back: the
# device returns 8 files; now packed) and act_decode.py after its launch fix.
S=$SECONDS
D=bench/results/2026-12-03_issue11-decode-layouts_NVIDIA-H200
export PYTHONPATH=$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
R=$(mktemp -d)
for s in rope_layouts act_decode; do
  OUT=$R timeout 200 python3 $D/$s.py > $R/$s.log 2>&1
  echo "$s rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt; grep -c DIFFER $R/$s.log; tail -3 $R/$s.log | cut -c1-300
done
tar czf $OUT/callA2.tar.gz -C $R .
