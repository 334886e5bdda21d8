#!/usr/bin/env bash
cd "$(dirname "$0")/.."
S=$SECONDS
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site CUPYKERN_CACHE_DIR=/tmp/ck-user
timeout 120 python3 -P ab/drift2.py > $OUT/drift2.log 2>&1; echo "drift2 rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
for tool in memcheck racecheck; do
  timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families activation,quant --num-tokens 600 > $OUT/sanitize_600_$tool.log 2>&1
  echo "sanitize 600 $tool rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
done
