#!/usr/bin/env bash
# Call 1 (on cf4342d), as run from the checkout's root: Inductor's kernels into a Triton
# cache, the bisect of the gated kernel, and item 16's floor.py again.
pip install -q --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=$PWD:/tmp/site
D=bench/results/2026-12-01_issue11-bisect_NVIDIA-H200
python3 $D/tc_dump.py > $OUT/tc_dump.log 2>&1; tail -3 $OUT/tc_dump.log
python3 -P $D/bisect.py $OUT/triton > $OUT/bisect.log 2>&1; tail -4 $OUT/bisect.log
python3 -P bench/results/2026-12-01_issue11-decode_NVIDIA-H200/floor.py > $OUT/floor.log 2>&1; tail -3 $OUT/floor.log
