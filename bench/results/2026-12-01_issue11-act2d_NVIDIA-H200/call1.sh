#!/usr/bin/env bash
# Call 1: GPU tests + sanitizers of the activation/quant families, then the A/B.
cd "$(dirname "$0")/.."
S=$SECONDS
SANITIZE=1 SANITIZE_FAMILIES=activation,quant TESTS="tests/test_activation.py tests/test_quant.py" \
  PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=220 bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
OPS="silu_and_mul gelu_and_mul swiglu silu_and_mul_quant"
N="--num-tokens 1,16,64,4096,16384"
AB_JOBS="base a8 $OPS $N;new a8 $OPS $N;base a70 $OPS --model llama-3.1-70b $N;new a70 $OPS --model llama-3.1-70b $N;base f32 silu_and_mul --dtype fp32 $N;new f32 silu_and_mul --dtype fp32 $N;base r8 rms_norm fused_add_rms_norm --num-tokens 1,16,64;exp r8 rms_norm fused_add_rms_norm --num-tokens 1,16,64;base r70 rms_norm fused_add_rms_norm --model llama-3.1-70b --num-tokens 1,16,64;exp r70 rms_norm fused_add_rms_norm --model llama-3.1-70b --num-tokens 1,16,64;new a8again $OPS $N" DEADLINE=$((570 - (SECONDS - S))) bash ab/run.sh
echo "ab rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
