#!/usr/bin/env bash
# Call B (NOTES item 28): where rms_norm's reread with hints (exp-reread-hint, d838072)
# overtakes HEAD's registers (36d32aa): 1024-32768 rows, bf16 and fp32, llama-3.1-8b and
# -70b, 2 / 4 / 8 leaves a thread, two runs in reversed order.
#   here: bash bench/ab.sh trees HEAD exp-reread-hint
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
T="--num-tokens 1024,2048,4096,8192,16384,32768 --vecs-per-thread 2,4,8 --dtype bf16,fp32 --repeat 30"
N8="rms_norm $T"
N70="rms_norm --model llama-3.1-70b $T"
run1="HEAD n8a $N8; exp-reread-hint n8a $N8; HEAD n70a $N70; exp-reread-hint n70a $N70;"
run2="exp-reread-hint n70b $N70; HEAD n70b $N70; exp-reread-hint n8b $N8; HEAD n8b $N8"
AB_JOBS="$run1 $run2" DEADLINE=$((560 - (SECONDS - S))) bash bench/ab.sh run
echo "callB $((SECONDS - S)) s" | tee -a $OUT/calls.txt
tail -12 $OUT/ab/summary.txt 2>/dev/null
