#!/usr/bin/env bash
# Call 2 (NOTES item 25): the decode layout past 64 rows while the rows' threads fill at
# most half the GPU (plans.DECODE_FILL_SHARE; the fused add at any size), the working tree
# ("new") against main (05abb68), interleaved, torch-free `cupykern sweep` at the row
# counts whose layout changes (and 1024 as a control); then the row families' GPU tests
# and golden on the working tree, and both sanitizers on norm and quant in fp16 (fp16's
# fused add of 2833c5f; bench/sanitize.py runs bf16 and fp32 by default).
#   here: bash bench/ab.sh trees main
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
G="rms_norm layer_norm row_reduce rms_norm_quant rms_norm_dynamic_per_token_quant fused_add_rms_norm_quant fused_add_rms_norm_dynamic_per_token_quant --num-tokens 128,256,512,1024"
F="fused_add_rms_norm --num-tokens 128,256,512,1024,4096,16384"
jobs=""; declare -A round
for t in main new main new main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  jobs+="$t g8r$n $G; $t g70r$n $G --model llama-3.1-70b; $t f8r$n $F; $t f70r$n $F --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=$((330 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
TESTS="tests/test_norm.py tests/test_quant.py tests/test_softmax.py tests/test_row_reduce.py tests/test_reduction_tree.py tests/test_golden.py tests/test_sweep.py tests/test_cli.py tests/test_property.py" \
  PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((585 - (SECONDS - S))) \
  SANITIZE=1 SANITIZE_FAMILIES=norm,quant SANITIZE_ARGS="--dtypes fp16" bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|failure|rc ' $OUT/session.log | tail -12
(cd $OUT && tar czf all.tar.gz --exclude=ab.tar.gz --exclude=calls.txt --exclude=all.tar.gz . && \
  find . -maxdepth 1 -type f ! -name ab.tar.gz ! -name calls.txt ! -name all.tar.gz -delete)
