#!/usr/bin/env bash
cd "$(dirname "$0")/.."
S=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site CUPYKERN_CACHE_DIR=/tmp/ck-user
TORCH_LOGS=output_code timeout 300 python3 -P ab/tc.py > $OUT/tc.log 2> $OUT/tc_inductor.log; echo "tc rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
