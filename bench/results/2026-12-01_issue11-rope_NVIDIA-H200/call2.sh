#!/usr/bin/env bash
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
PYTHONPATH=$PWD timeout 200 python3 -P ab/rope_lib.py > $OUT/rope_lib.log 2>&1; echo "rope_lib rc $?" >> $OUT/env.txt
OPS="silu_and_mul gelu_and_mul"
N="--num-tokens 1,16,64,4096,16384"
AB_JOBS="base a8 $OPS $N;new a8 $OPS $N;base a70 $OPS --model llama-3.1-70b $N;new a70 $OPS --model llama-3.1-70b $N;base f32 $OPS --dtype fp32 $N;new f32 $OPS --dtype fp32 $N" DEADLINE=$((560 - SECONDS)) bash ab/run.sh
