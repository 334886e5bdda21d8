#!/usr/bin/env bash
# Call 2 (NOTES item 24): "new" (the checkout: main + widen + the weights-first fused add)
# against main (ab/main) and widen alone (ab/widen, the fused add only), interleaved;
# then the whole GPU suite on the checkout, golden against main (the widening and the
# paired rounding change no bits) and both sanitizers on every family they touch.
#   here: bash bench/ab.sh trees main widen
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
R="rms_norm fused_add_rms_norm layer_norm softmax silu_and_mul gelu_and_mul --num-tokens 1,16,64,4096"
F="fused_add_rms_norm --num-tokens 1,16,64,4096"
jobs=""; declare -A round
for t in main new widen main new widen main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  ops=$R; [ "$t" = widen ] && ops=$F
  jobs+="$t r8r$n $ops; $t r70r$n $ops --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=$((230 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
GOLDEN=$PWD/ab/main PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((575 - (SECONDS - S))) \
  SANITIZE=1 SANITIZE_FAMILIES=norm,quant,softmax,row_reduce,activation bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure' $OUT/session.log | tail -12
(cd $OUT && tar czf all.tar.gz --exclude=ab.tar.gz --exclude=calls.txt --exclude=all.tar.gz * && \
  find . -maxdepth 1 -type f ! -name ab.tar.gz ! -name calls.txt ! -name all.tar.gz -delete)
