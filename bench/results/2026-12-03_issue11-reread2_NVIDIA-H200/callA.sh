#!/usr/bin/env bash
# Call A (NOTES item 29): rms_norm's rereading pass 2 with both loads first
# (exp-reread2-first) and with launch bounds for 2048 threads (exp-reread2-lb) against
# b3624f0, in the rereading layouts (2 leaves a thread) at 8192-32768 rows, bf16 and fp32,
# llama-3.1-8b and -70b, two runs in reversed order; then the SASS order of pass 2.
#   here: bash bench/ab.sh trees HEAD exp-reread2-first exp-reread2-lb
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-03_issue11-reread2_NVIDIA-H200
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
T="--num-tokens 8192,16384,32768 --vecs-per-thread 2 --dtype bf16,fp32 --repeat 30"
N8="rms_norm $T"
N70="rms_norm --model llama-3.1-70b $T"
run1="HEAD n8a $N8; exp-reread2-first n8a $N8; exp-reread2-lb n8a $N8; HEAD n70a $N70; exp-reread2-first n70a $N70; exp-reread2-lb n70a $N70;"
run2="exp-reread2-lb n70b $N70; exp-reread2-first n70b $N70; HEAD n70b $N70; exp-reread2-lb n8b $N8; exp-reread2-first n8b $N8; HEAD n8b $N8"
AB_JOBS="$run1 $run2" DEADLINE=$((420 - (SECONDS - S))) bash bench/ab.sh run
tail -14 $OUT/ab/summary.txt 2>/dev/null
PYTHONPATH=/tmp/site python3 $D/sass_order.py ab/HEAD ab/exp-reread2-first ab/exp-reread2-lb > $OUT/sass_order.txt 2>&1
cat $OUT/sass_order.txt | head -60
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
