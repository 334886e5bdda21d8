#!/usr/bin/env bash
# Call C (NOTES item 27): the working tree (softmax's decode layout to a quarter of the
# GPU's threads, its exact walk to 256 rows; kernels as 083bc8e) on the GPU: the GPU suite
# without test_llm (test_golden: the bits of tests/data/golden_outputs.json), then
# memcheck and racecheck on softmax and the norms at 3, 200 and 600 tokens in bf16, fp16
# and fp32 (200: softmax's exact walk past the decode sizes).
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=585 SANITIZE=1 SANITIZE_FAMILIES=softmax,norm \
  SANITIZE_ARGS="--num-tokens 3,200,600 --dtypes bf16,fp16,fp32" bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $?" >> $OUT/session.log
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|rc [0-9]+ in' $OUT/session.log | tail -20
