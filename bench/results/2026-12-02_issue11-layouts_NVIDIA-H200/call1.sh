#!/usr/bin/env bash
# Call 1 (NOTES item 25): HEAD's kernels on the GPU (fp16's fused add of 2833c5f had not
# run), golden against dab9c5a (before the widening) with the FP8 norms' new cases, both
# sanitizers on norm and quant; then the row ops' layouts between decode and prefill
# sizes (`--vecs-per-thread 1,2,4,8` at 128-4096 tokens, 8b and 70b): which leaves a
# thread each op wants at 256-4096 rows, where peers lead by 1-15 %.
#   here: bash bench/ab.sh trees dab9c5a
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
OPS="rms_norm fused_add_rms_norm layer_norm softmax --num-tokens 128,256,512,1024,2048,4096 --vecs-per-thread 1,2,4,8"
GOLDEN=$PWD/ab/dab9c5a PYTEST_ARGS="-n 15 --deselect tests/test_golden.py" BENCHES= DEADLINE_S=585 \
  SANITIZE=1 SANITIZE_FAMILIES=norm,quant \
  SWEEPS="--json layouts-8b.json $OPS;--json layouts-70b.json $OPS --model llama-3.1-70b" \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $?" >> $OUT/session.log
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure|rc ' $OUT/session.log | tail -20
