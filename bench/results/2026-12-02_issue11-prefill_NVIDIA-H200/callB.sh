#!/usr/bin/env bash
# Call B (NOTES item 26): the working tree (the activations' block-per-item grid at any
# size that fits it; rms_norm's 8 leaves a thread at prefill sizes) on the GPU: the GPU
# suite without test_llm (test_golden holds the bits to tests/data/golden_outputs.json),
# memcheck and racecheck on norm, activation and quant at 3 and 600 tokens (600: the
# prefill layouts and the new prefill grid) in bf16, fp16 and fp32; then, torch-free,
# the two choices side by side where the rule was not timed: rms_norm's 4 and 8 leaves
# in fp32 (8b, 70b) and bf16 rows of 5120 and 16384; the walk and the block-per-item
# grid for swiglu, silu_and_mul_quant and scalar (vec_width 1) silu_and_mul.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
R="--num-tokens 1024,4096,16384 --vecs-per-thread 4,8"
A="--num-tokens 4096,16384 --grid-stride true,false"
PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=585 SANITIZE=1 SANITIZE_FAMILIES=norm,activation,quant \
  SANITIZE_ARGS="--num-tokens 3,600 --dtypes bf16,fp16,fp32" \
  SWEEPS="--json rms-fp32-8b.json rms_norm --dtype fp32 $R;--json rms-fp32-70b.json rms_norm --dtype fp32 --model llama-3.1-70b $R;--json rms-wide.json rms_norm --hidden-size 5120,16384 $R;--json act-walk.json swiglu silu_and_mul_quant $A;--json act-scalar.json silu_and_mul --vec-width 1 $A" \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $?" >> $OUT/session.log
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|rc [0-9]+ in' $OUT/session.log | tail -20
