#!/usr/bin/env bash
# Call A: the gated kernels' branches against main, interleaved (NOTES item 20).
A8="silu_and_mul gelu_and_mul silu_and_mul_quant --num-tokens 1,16,64,4096"
A70="silu_and_mul gelu_and_mul --model llama-3.1-70b --num-tokens 1,16,64"
jobs=""
for t in main next-issue11-act-both next-issue11-act-whole-vectors next-issue11-act-half-vectors \
         main next-issue11-act-both next-issue11-act-whole-vectors next-issue11-act-half-vectors main; do
  n=$(( $(grep -o "$t a8" <<< "$jobs" | wc -l) + 1 ))
  jobs+="$t a8r$n $A8; $t a70r$n $A70; "
done
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
AB_JOBS=$jobs DEADLINE=${DEADLINE:-550} bash bench/ab.sh run
