#!/usr/bin/env bash
# Call 2 (NOTES item 23): the library-side bisect (call 1 ran it without cupykern on the
# path), then the narrowed rule (rms_norm_rows one row a block only without the fused add
# and up to 2 leaves a thread; "new", the working tree) against bb3824d (ab/main),
# interleaved; the GPU tests of the row kernels, golden against bb3824d, and both
# sanitizers on every family with RowGroup at 1 and 3 tokens.
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
D=bench/results/2026-12-02_issue11-rmsbisect3_NVIDIA-H200
PYTHONPATH=$PWD CUPYKERN_CACHE_DIR=/tmp/ck-user python3 $D/bisect_rms3.py > $OUT/bisect_rms3.log 2>&1
echo "bisect rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
R="rms_norm fused_add_rms_norm layer_norm softmax row_reduce --num-tokens 1,16,64,4096"
jobs=""; declare -A round
for t in main new main new main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=$((200 - (SECONDS - S))) bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
GOLDEN=$PWD/ab/main PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((420 - (SECONDS - S))) \
  TESTS="tests/test_norm.py tests/test_softmax.py tests/test_row_reduce.py tests/test_quant.py tests/test_reduction_tree.py" \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
mv $OUT/results.tar.gz $OUT/results-tests.tar.gz
SANITIZE=1 SANITIZE_FAMILIES=norm,quant,softmax,row_reduce TESTS= BENCHES= \
  DEADLINE_S=$((560 - (SECONDS - S))) bash bench/gpu_session.sh > $OUT/sanitize.log 2>&1
echo "sanitize rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
tar czf $OUT/logs.tar.gz -C $OUT session.log sanitize.log summary.txt 2>/dev/null
grep -ahE 'passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|cases,|failure' $OUT/session.log $OUT/sanitize.log | tail -12
