#!/usr/bin/env bash
cd "$(dirname "$0")/.."
TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15 -rf" SANITIZE=1 SANITIZE_FAMILIES=rope,activation,quant \
  GOLDEN=$PWD/ab/base BENCHES="" DEADLINE_S=330 bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $?" > $OUT/env.txt
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
PYTHONPATH=$PWD timeout 90 python3 -P ab/rope_heads.py > $OUT/rope_heads.log 2>&1; echo "rope_heads rc $?" >> $OUT/env.txt
N="--num-tokens 1,16,64,4096,16384"
AB_JOBS="base r8 apply_rope $N;new r8 apply_rope $N;base r70 apply_rope --model llama-3.1-70b $N;new r70 apply_rope --model llama-3.1-70b $N" DEADLINE=$((585 - SECONDS)) bash ab/run.sh
