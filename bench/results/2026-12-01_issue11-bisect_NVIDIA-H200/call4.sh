#!/usr/bin/env bash
# Call 4 (3be40ec: rms_norm alone of the norm kernels 32-bit, fused_add_rms_norm and layer_norm back to 64-bit):
# golden against ab/base, the norm, launcher and activation GPU tests, then the whole peers run
# (cut short by DEADLINE_S after 14 of its 16 rows: the tests and golden had taken 140 s of it).
cd "$(dirname "$0")/../../.."
S=$SECONDS
GOLDEN=$PWD/ab/base TESTS="tests/test_norm.py tests/test_launcher.py tests/test_activation.py" PYTEST_ARGS="-n 15" BENCHES= PEERS="" DEADLINE_S=585 \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
