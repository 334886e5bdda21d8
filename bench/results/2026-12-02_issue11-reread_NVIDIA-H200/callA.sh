#!/usr/bin/env bash
# Call A (NOTES item 28), torch-free: rms_norm reading its row again in pass 2 instead of
# holding it in registers (Inductor's structure), plain loads (exp-reread-plain) and with
# Triton's evict_last / evict_first hints (exp-reread-hint); the fused add rereading its
# stored sum (exp-reread-fused, which carries the plain rms_norm reread too), against HEAD
# (36d32aa); every layout, 256-16384 rows of llama-3.1-8b and -70b, bf16, two runs in
# reversed order. Then the device-to-device copy by size (copy_sizes.py).
#   here: bash bench/ab.sh trees HEAD exp-reread-plain exp-reread-hint exp-reread-fused
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
D=bench/results/2026-12-02_issue11-reread_NVIDIA-H200
T="--num-tokens 256,1024,4096,16384"
N8="rms_norm $T --vecs-per-thread 1,2,4,8"
N70="rms_norm --model llama-3.1-70b $T --vecs-per-thread 1,2,4,8"
F8="fused_add_rms_norm $T --vecs-per-thread 1,2,4,8"
F70="fused_add_rms_norm --model llama-3.1-70b $T --vecs-per-thread 1,2,4,8"
run1="HEAD n8a $N8; exp-reread-plain n8a $N8; exp-reread-hint n8a $N8; HEAD n70a $N70; exp-reread-plain n70a $N70;"
run1+="exp-reread-hint n70a $N70; HEAD f8a $F8; exp-reread-fused f8a $F8; HEAD f70a $F70; exp-reread-fused f70a $F70;"
run2="exp-reread-fused f70b $F70; HEAD f70b $F70; exp-reread-fused f8b $F8; HEAD f8b $F8; exp-reread-hint n70b $N70;"
run2+="exp-reread-plain n70b $N70; HEAD n70b $N70; exp-reread-hint n8b $N8; exp-reread-plain n8b $N8; HEAD n8b $N8"
timeout 60 python3 $D/copy_sizes.py 2>&1 | tee $OUT/copy_sizes.log
AB_JOBS="$run1 $run2" DEADLINE=$((560 - (SECONDS - S))) bash bench/ab.sh run
echo "callA $((SECONDS - S)) s" | tee -a $OUT/calls.txt
tail -25 $OUT/ab/summary.txt 2>/dev/null
