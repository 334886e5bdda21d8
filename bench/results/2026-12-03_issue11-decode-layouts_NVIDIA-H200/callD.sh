#!/usr/bin/env bash
# Call D (NOTES item 34): the dependent-launch GPU tests after their stream fix, then a peers
# run of llama-3.1-70b's RoPE ops (call C's whole run ended before them).
S=$SECONDS
COMMIT=$1
export CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_dependent_launch.py > $OUT/pytest_dependent.log 2>&1
echo "pytest rc $?"; tail -1 $OUT/pytest_dependent.log
CUPYKERN_COMMIT=$COMMIT TESTS= BENCHES= PEERS="--models llama-3.1-70b --ops apply_rope,qk_rms_norm_rope" \
  DEADLINE_S=$((300 - (SECONDS - S))) OUT=$OUT bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "peers rc $?"; grep -A30 "^| model" $OUT/session.log | head -8; cp bench/results/*_peers_*_$COMMIT.* $OUT/ 2>/dev/null
echo "callD $((SECONDS - S)) s"
