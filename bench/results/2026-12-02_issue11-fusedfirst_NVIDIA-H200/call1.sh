#!/usr/bin/env bash
# Call 1 (NOTES item 24): the weights-first fused add
# (ab/fused-weights-first) against main (ab/main), interleaved, rms_norm as the control;
# the whole GPU suite on the checkout (main) with golden against facd4e4 (the last
# GPU-tested kernels) and both sanitizers on every RowGroup family; then the branch's
# norm tests, its golden against main and its norm sanitizers, run from its own tree.
#   here: bash bench/ab.sh trees main fused-weights-first facd4e4
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
R="fused_add_rms_norm rms_norm --num-tokens 1,16,64,4096"
jobs=""; declare -A round
for t in main fused-weights-first main fused-weights-first main fused-weights-first main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=$((140 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
GOLDEN=$PWD/ab/facd4e4 PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((380 - (SECONDS - S))) \
  SANITIZE=1 SANITIZE_FAMILIES=norm,quant,softmax,row_reduce bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
mv $OUT/results.tar.gz $OUT/results-main.tar.gz; mv $OUT/summary.txt $OUT/summary-main.txt
B=ab/fused-weights-first
cp -r tests bench pyproject.toml $B/
(cd $B && CUPYKERN_COMMIT=$(cat COMMIT) GOLDEN=$PWD/../main PYTEST_ARGS="-n 15" BENCHES= \
  TESTS="tests/test_norm.py tests/test_reduction_tree.py tests/test_kernel_abi.py" \
  SANITIZE=1 SANITIZE_FAMILIES=norm DEADLINE_S=$((585 - (SECONDS - S))) bash bench/gpu_session.sh > $OUT/session-branch.log 2>&1)
echo "branch session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
mv $OUT/results.tar.gz $OUT/results-branch.tar.gz
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure' $OUT/session.log $OUT/session-branch.log | tail -16
# The device tool returns at most 8 files: everything but the A/B and calls.txt in one.
(cd $OUT && tar czf all.tar.gz --exclude=ab.tar.gz --exclude=calls.txt --exclude=all.tar.gz . && \
  find . -maxdepth 1 -type f ! -name ab.tar.gz ! -name calls.txt ! -name all.tar.gz -delete)
