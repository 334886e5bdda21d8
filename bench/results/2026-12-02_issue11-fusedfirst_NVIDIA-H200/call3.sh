#!/usr/bin/env bash
# Call 3 (NOTES item 24): apply_rope with its pair vectors widened as 32-bit words
# (rope.cu::rotate_and_store through element(); "new", the checkout) against main
# (ab/main), interleaved; then the RoPE GPU tests on the checkout, golden against main
# and both sanitizers on the rope family. About 190 s of device time were left.
#   here: bash bench/ab.sh trees main
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
R="apply_rope --num-tokens 1,16,64,4096"
jobs=""; declare -A round
for t in main new main new main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=$((75 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
GOLDEN=$PWD/ab/main PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((170 - (SECONDS - S))) TESTS="tests/test_rope.py" \
  SANITIZE=1 SANITIZE_FAMILIES=rope bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure' $OUT/session.log | tail -8
(cd $OUT && tar czf all.tar.gz --exclude=ab.tar.gz --exclude=calls.txt --exclude=all.tar.gz * && \
  find . -maxdepth 1 -type f ! -name ab.tar.gz ! -name calls.txt ! -name all.tar.gz -delete)
