#!/usr/bin/env bash
# Call 3 (NOTES item 25): the committed tree (DECODE_FILL_SHARE with row_reduce at 0, the
# spill ledger): the whole GPU suite with golden (tests/data/golden_outputs.json: dab9c5a's
# digests, 171 cases), both sanitizers on norm, quant and row_reduce at 3 and 300 tokens
# (300 rows now take the decode layout) in bf16, fp16 and fp32.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=585 SANITIZE=1 SANITIZE_FAMILIES=norm,quant,row_reduce \
  SANITIZE_ARGS="--num-tokens 3,300 --dtypes bf16,fp16,fp32" bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $?" >> $OUT/session.log
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|failure|rc ' $OUT/session.log | tail -12
