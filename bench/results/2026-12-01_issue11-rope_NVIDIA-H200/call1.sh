#!/usr/bin/env bash
# Call 1: rope structure experiment, then activation A/B (ab/base = HEAD vs working tree).
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/env.txt
PYTHONPATH=$PWD timeout 240 python3 -P ab/rope_iso.py > $OUT/rope_iso.log 2>&1; echo "rope_iso rc $?" >> $OUT/env.txt
OPS=silu_and_mul,gelu_and_mul
AB_JOBS="base a8 $OPS --model llama-3.1-8b --num-tokens 1,16,64,4096,16384;new a8 $OPS --model llama-3.1-8b --num-tokens 1,16,64,4096,16384;base a70 $OPS --model llama-3.1-70b --num-tokens 1,16,64,4096,16384;new a70 $OPS --model llama-3.1-70b --num-tokens 1,16,64,4096,16384;base f32 $OPS --dtype fp32 --num-tokens 1,64,4096,16384;new f32 $OPS --dtype fp32 --num-tokens 1,64,4096,16384" DEADLINE=$((580 - SECONDS)) bash ab/run.sh
