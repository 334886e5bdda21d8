#!/usr/bin/env bash
cd "$(dirname "$0")/.."
S=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site CUPYKERN_CACHE_DIR=/tmp/ck-user
timeout 200 python3 -P ab/tc2.py > $OUT/tc2.log 2>&1; echo "tc2 rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
