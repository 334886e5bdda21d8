#!/usr/bin/env bash
# Call A (NOTES item 36): the GPU suite at HEAD (the written arrays' overlap rules against
# weights, positions and the cache; plan_rope's block cap), host time per call at the base
# (ab/base: 1833623, made by `bash bench/ab.sh trees 1833623` plus its bench/) and at HEAD
# alternating, then gelu_decode.py. Everything packed into $OUT/callA.tar.gz.
S=$SECONDS
D=bench/results/2026-12-04_issue11-gelu-decode_NVIDIA-H200
R=$(mktemp -d)
H="--calls 20000"
OUT=$R/session SANITIZE= PYTEST_ARGS="-n 15" DEADLINE_S=330 \
  BENCHES="ab/base/bench/bench_host_overhead.py $H;bench/bench_host_overhead.py $H;ab/base/bench/bench_host_overhead.py $H;bench/bench_host_overhead.py $H" \
  bash bench/gpu_session.sh > $R/session.log 2>&1
echo "gpu_session rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
OUT=$R timeout $((585 - (SECONDS - S))) python3 $D/gelu_decode.py > $R/gelu_decode.log 2>&1
echo "gelu_decode rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
tail -4 $R/session.log; grep -E "^erfc|torch.compile/this" $R/gelu_decode.log | cut -c1-150; tail -3 $R/gelu_decode.log | cut -c1-300
tar czf $OUT/callA.tar.gz -C $R .
