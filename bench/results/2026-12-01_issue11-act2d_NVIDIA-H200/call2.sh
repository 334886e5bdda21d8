#!/usr/bin/env bash
# Call 2: golden vs HEAD, sanitizers at 600 tokens (the walk), row-kernel experiments, drift probe, GPU suite.
cd "$(dirname "$0")/.."
S=$SECONDS
export PYTHONUNBUFFERED=1
( export PYTHONPATH=$PWD CUPYKERN_CACHE_DIR=/tmp/ck-user
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv -lms 100 > $OUT/drift_clocks.csv 2>&1 &
  SMI=$!
  timeout 100 python3 -P ab/drift.py > $OUT/drift.log 2>&1; echo "drift rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
  kill $SMI )
for tool in memcheck racecheck; do
  PYTHONPATH=$PWD timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families activation,quant --num-tokens 600 > $OUT/sanitize_600_$tool.log 2>&1
  echo "sanitize 600 $tool rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
done
R8="rms_norm fused_add_rms_norm --num-tokens 1,16,64"
R70="rms_norm fused_add_rms_norm --model llama-3.1-70b --num-tokens 1,16,64"
AB_JOBS="new r8 $R8;exp1 r8 $R8;exp2 r8 $R8;exp3 r8 $R8;new r70 $R70;exp1 r70 $R70;exp2 r70 $R70;exp3 r70 $R70;new r8again $R8;exp3 r8again $R8" DEADLINE=120 bash ab/run.sh
echo "ab rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
GOLDEN=$PWD/ab/base PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=$((560 - (SECONDS - S))) bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
