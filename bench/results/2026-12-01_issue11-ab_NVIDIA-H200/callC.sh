#!/usr/bin/env bash
# Call C (54e6f92, the adopted branches): the A/B against a06b442 (ab/main) over the gated
# and row ops incl. row_reduce, then the GPU suite without test_llm, golden against
# a06b442, and both sanitizers on every changed family at 1 and 3 tokens.
export CUPYKERN_COMMIT=54e6f92
S=$SECONDS
A8="silu_and_mul gelu_and_mul silu_and_mul_quant --num-tokens 1,16,64,4096"
A70="silu_and_mul gelu_and_mul --model llama-3.1-70b --num-tokens 1,16,64"
R="rms_norm fused_add_rms_norm layer_norm softmax row_reduce apply_rope qk_rms_norm_rope --num-tokens 1,16,64,4096"
jobs=""
for t in main new main new; do
  n=$(( $(grep -o "$t a8" <<< "$jobs" | wc -l) + 1 ))
  jobs+="$t a8r$n $A8; $t a70r$n $A70; $t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=200 bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" >> $OUT/calls.txt
GOLDEN=$PWD/ab/main PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((560 - (SECONDS - S))) \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
mv $OUT/results.tar.gz $OUT/results-tests.tar.gz
SANITIZE=1 SANITIZE_FAMILIES=activation,quant,norm,softmax,row_reduce,rope TESTS= BENCHES= \
  DEADLINE_S=$((585 - (SECONDS - S))) bash bench/gpu_session.sh > $OUT/sanitize.log 2>&1
echo "sanitize rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
