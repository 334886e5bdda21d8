#!/usr/bin/env bash
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user PYTHONPATH=$PWD
timeout 150 python3 -P ab/rope_heads.py > $OUT/rope_heads.log 2>&1; echo "rope_heads rc $?" >> $OUT/env.txt
for tool in memcheck racecheck; do
  timeout 120 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope,activation,quant --num-tokens 600 > $OUT/sanitize_600_$tool.log 2>&1
  echo "sanitize 600 $tool rc $?" >> $OUT/env.txt
done
