#!/usr/bin/env bash
# Call A (NOTES item 26): Inductor's kernels at the prefill points where torch.compile
# leads (tc_dump_prefill.py, its caches packed into $OUT/tc.tar.gz); then, torch-free:
# streaming cache hints (st.global.cs, and ld.global.cs too) on every 16-byte access
# against the working tree (HEAD), interleaved; the activations' block-per-item grid
# against the grid-stride walk at prefill sizes; rms_norm 70b's 2 / 4 / 8 leaves at
# 1024-16384 tokens, twice.
#   here: bash bench/ab.sh trees HEAD; mv ab/HEAD ab/stcs; cp -r ab/stcs ab/ldstcs; patch vec.cuh
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
D=bench/results/2026-12-02_issue11-prefill_NVIDIA-H200
S=$SECONDS
timeout 200 python3 $D/tc_dump_prefill.py > $OUT/tc_dump.log 2>&1
echo "tc_dump rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
(cd $OUT && tar czf tc.tar.gz tc && rm -rf tc)
H="rms_norm fused_add_rms_norm silu_and_mul --model llama-3.1-70b --num-tokens 4096,16384"
L="rms_norm --model llama-3.1-70b --num-tokens 1024,2048,4096,16384 --vecs-per-thread 2,4,8"
jobs="new h1 $H; stcs h1 $H; ldstcs h1 $H; new L1 $L;"
jobs+="new act70 silu_and_mul --model llama-3.1-70b --num-tokens 1024,4096,16384 --grid-stride true,false --block-size 256,1024;"
jobs+="new act8 silu_and_mul gelu_and_mul --num-tokens 4096,16384 --grid-stride true,false --block-size 256,1024;"
jobs+="new h2 $H; stcs h2 $H; ldstcs h2 $H; new L2 $L"
AB_JOBS=$jobs DEADLINE=$((580 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
cat $OUT/calls.txt
