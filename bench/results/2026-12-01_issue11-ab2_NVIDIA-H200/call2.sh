#!/usr/bin/env bash
# Call 2 (NOTES item 22): the adopted tree (kExact for the row kernels, 4-byte vectors) against
# 4dad09d (ab/main: `bash bench/ab.sh trees main` before the commits), interleaved, then the
# GPU suite without test_llm, golden against 4dad09d, and both sanitizers on every changed
# family at 1 and 3 tokens.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
A8="silu_and_mul gelu_and_mul silu_and_mul_quant --num-tokens 1,16,64,4096"
A70="silu_and_mul gelu_and_mul --model llama-3.1-70b --num-tokens 1,16,64"
R="rms_norm fused_add_rms_norm layer_norm softmax --num-tokens 1,16,64,4096"
jobs=""; declare -A round
for t in main new main new main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; $t a8r$n $A8; $t a70r$n $A70; "
done
AB_JOBS=$jobs DEADLINE=215 bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
GOLDEN=$PWD/ab/main PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((530 - (SECONDS - S))) \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
mv $OUT/results.tar.gz $OUT/results-tests.tar.gz
SANITIZE=1 SANITIZE_FAMILIES=activation,quant,norm,softmax TESTS= BENCHES= \
  DEADLINE_S=$((585 - (SECONDS - S))) bash bench/gpu_session.sh > $OUT/sanitize.log 2>&1
echo "sanitize rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure' $OUT/session.log $OUT/sanitize.log | tail -12
