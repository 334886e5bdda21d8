#!/usr/bin/env bash
# Call 2: the 32-bit gated kernels (working tree): GPU tests, golden against HEAD (ab/base),
# sanitizers at 1, 3 and 600 tokens, then the A/B (ab/run.sh) with two experiment trees:
# p32wide (32-bit parameters widened at the kernel's entry) and rowsp32 (the norm kernels'
# parameters 32-bit, widened).
cd "$(dirname "$0")/../../.."
S=$SECONDS
pip install -q --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site
SANITIZE=1 SANITIZE_FAMILIES=activation,quant GOLDEN=$PWD/ab/base TESTS="tests/test_activation.py tests/test_quant.py" \
  PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=200 bash bench/gpu_session.sh > $OUT/session.log 2>&1
echo "session rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
for tool in memcheck racecheck; do
  PYTHONPATH=$PWD:/tmp/site /usr/local/cuda/bin/compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize.py \
    --families activation,quant --num-tokens 600 > $OUT/sanitize600_$tool.log 2>&1
  echo "sanitize600 $tool rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
done
OPS="silu_and_mul gelu_and_mul swiglu silu_and_mul_quant"
N="--num-tokens 1,16,64,4096,16384"
R="rms_norm fused_add_rms_norm layer_norm --num-tokens 1,16,64,4096"
AB_JOBS="base a8 $OPS $N;new a8 $OPS $N;p32wide a8 silu_and_mul gelu_and_mul --num-tokens 1,16,64;base a70 $OPS --model llama-3.1-70b $N;new a70 $OPS --model llama-3.1-70b $N;base r8 $R;rowsp32 r8 $R;base r70 $R --model llama-3.1-70b;rowsp32 r70 $R --model llama-3.1-70b;new a8again $OPS $N" \
  DEADLINE=$((570 - (SECONDS - S))) bash ab/run.sh
echo "ab rc $? $((SECONDS - S)) s" >> $OUT/calls.txt
