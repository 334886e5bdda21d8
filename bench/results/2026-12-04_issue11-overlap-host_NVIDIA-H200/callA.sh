#!/usr/bin/env bash
# Call A (NOTES item 37): host time per call of the overlap rules' three forms alternating
# (ab/07dc9cc: before; ab/a0ab08a: "diff"; the working tree cfdcb62: "memo"; each made by
# `bash bench/ab.sh trees 07dc9cc a0ab08a` plus its bench/), two rounds, then the whole
# GPU suite at the working tree. Everything packed into $OUT/callA.tar.gz.
S=$SECONDS
R=$(mktemp -d)
H="--calls 20000"
B=bench/bench_host_overhead.py
OUT=$R/session SANITIZE= PYTEST_ARGS="-n 15" DEADLINE_S=560 \
  BENCHES="ab/07dc9cc/$B $H;ab/a0ab08a/$B $H;$B $H;ab/07dc9cc/$B $H;ab/a0ab08a/$B $H;$B $H" \
  bash bench/gpu_session.sh > $R/session.log 2>&1
echo "gpu_session rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
tail -5 $R/session.log
grep -h -E "^│ (qk_rms_norm_rope|apply_rope|rms_norm|fused_add_rms_norm) " $R/session/results/bench_*_bench_host_overhead.log | cut -c1-170
tar czf $OUT/callA.tar.gz -C $R .
