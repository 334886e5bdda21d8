#!/usr/bin/env bash
# Call 4 (the tree of the commit after 32-bit norm arguments, layer_norm back to 64-bit):
# golden against ab/base, the norm, launcher and activation GPU tests, then the full peers run README quotes.
cd "$(dirname "$0")/../../.."
S=$SECONDS
GOLDEN=$PWD/ab/base TESTS="tests/test_norm.py tests/test_launcher.py tests/test_activation.py" PYTEST_ARGS="-n 15" BENCHES= PEERS="" DEADLINE_S=585 \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
