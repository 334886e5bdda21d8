#!/usr/bin/env bash
# Call 3: the 32-bit gated and norm kernels (working tree): the GPU suite without test_llm,
# golden against HEAD (ab/base), sanitizers of the norm family at 1 and 3 tokens, then
# the A/B of the norm kernels (ab/run.sh).
cd "$(dirname "$0")/../../.."
S=$SECONDS
pip install -q --target /tmp/site .whl/*.whl > /dev/null 2>&1
SANITIZE=1 SANITIZE_FAMILIES=norm GOLDEN=$PWD/ab/base PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=330 \
  bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
R="rms_norm fused_add_rms_norm layer_norm --num-tokens 1,16,64,4096,16384"
AB_JOBS="base r8 $R;new r8 $R;base r70 $R --model llama-3.1-70b;new r70 $R --model llama-3.1-70b;new r8again $R" \
  DEADLINE=$((570 - (SECONDS - S))) bash ab/run.sh
echo "ab rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
