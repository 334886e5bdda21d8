#!/usr/bin/env bash
# Call B (NOTES item 27): the online softmax (working tree: one (max, sum) reduction,
# with call A's rule) against exp-softmax-exact (dbfa13f: two reductions, the same rule),
# torch-free, llama-3.1-8b and -70b at 1-16384 tokens, bf16 and fp32, interleaved twice;
# then the GPU tests of softmax and the reduction tree, and memcheck / racecheck on the
# softmax family at 3 and 600 tokens.
#   here: bash bench/ab.sh trees exp-softmax-exact
export CUPYKERN_COMMIT=${CUPYKERN_COMMIT:?the checkout\'s commit}
S=$SECONDS
S8="softmax --dtype bf16,fp32"
S70="softmax --dtype bf16,fp32 --model llama-3.1-70b"
jobs="exp-softmax-exact s8a $S8; new s8a $S8; exp-softmax-exact s70a $S70; new s70a $S70;"
jobs+="new s8b $S8; exp-softmax-exact s8b $S8; new s70b $S70; exp-softmax-exact s70b $S70"
AB_JOBS=$jobs DEADLINE=300 bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
export CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 15 tests/test_softmax.py tests/test_reduction_tree.py \
  tests/test_property.py tests/test_golden.py > $OUT/pytest.log 2>&1
echo "pytest rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
for tool in memcheck racecheck; do
  timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families softmax --num-tokens 3,600 --dtypes bf16,fp16,fp32 > $OUT/sanitize_$tool.log 2>&1
  echo "sanitize $tool rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
done
tail -3 $OUT/pytest.log; grep -h "SUMMARY" $OUT/sanitize_*.log
