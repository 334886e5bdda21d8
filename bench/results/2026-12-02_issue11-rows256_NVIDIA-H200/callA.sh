#!/usr/bin/env bash
# Call A (NOTES item 27), torch-free: softmax with its exact walk up to 512 rows (tree
# exp-softmax-exact, dbfa13f) against HEAD (083bc8e), every layout, 128-1024 rows of
# llama-3.1-8b and -70b, interleaved twice; rms_norm and the fused add of 8b at 256 / 512
# rows with 1 / 2 / 4 leaves a thread.
#   here: bash bench/ab.sh trees HEAD exp-softmax-exact
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
S8="softmax --num-tokens 128,256,512,1024 --vecs-per-thread 1,2,4"
S70="softmax --model llama-3.1-70b --num-tokens 128,256,512,1024 --vecs-per-thread 1,2,4,8"
N8="rms_norm fused_add_rms_norm --num-tokens 256,512 --vecs-per-thread 1,2,4"
jobs="HEAD s8a $S8; exp-softmax-exact s8a $S8; HEAD s70a $S70; exp-softmax-exact s70a $S70; HEAD n8a $N8;"
jobs+="exp-softmax-exact s8b $S8; HEAD s8b $S8; exp-softmax-exact s70b $S70; HEAD s70b $S70; HEAD n8b $N8"
AB_JOBS=$jobs DEADLINE=$((580 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
cat $OUT/ab/summary.txt 2>/dev/null | tail -15
