#!/usr/bin/env bash
# Call C (NOTES item 34): the whole GPU suite with apply_rope's wide blocks of one token and
# qk_rms_norm_rope's of two; bench/sanitize.py's rope family at 1, 3 and 600 tokens under
# compute-sanitizer memcheck and racecheck; then the whole peers run (README's table).
S=$SECONDS
COMMIT=$1
export CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
R=$(mktemp -d)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider --maxfail=50 -n 15 tests --ignore=tests/test_llm.py \
  > $R/pytest_gpu.log 2>&1
echo "pytest rc $?"; tail -2 $R/pytest_gpu.log; echo "tests $((SECONDS - S)) s" | tee -a $R/calls.txt
for tool in memcheck racecheck; do
  timeout 60 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families rope --num-tokens 1,3,600 --dtypes bf16,fp16,fp32 > $R/sanitize_rope_$tool.log 2>&1
  echo "sanitize $tool rc $?"; grep -E "SUMMARY|failure" $R/sanitize_rope_$tool.log | tail -2
  echo "$tool $((SECONDS - S)) s" | tee -a $R/calls.txt
done
cp $R/pytest_gpu.log $OUT/
tar czf $OUT/callC_tests.tar.gz -C $R .
CUPYKERN_COMMIT=$COMMIT TESTS= BENCHES= PEERS="" DEADLINE_S=$((592 - (SECONDS - S))) OUT=$OUT bash bench/gpu_session.sh \
  > $OUT/session.log 2>&1
echo "peers rc $?"; tail -4 $OUT/session.log; cp bench/results/*_peers_*_$COMMIT.* $OUT/ 2>/dev/null
echo "callC $((SECONDS - S)) s"
