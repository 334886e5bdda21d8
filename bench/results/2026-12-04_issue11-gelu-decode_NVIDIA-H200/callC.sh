#!/usr/bin/env bash
# Call C (NOTES item 36): the GPU suite with act_and_mul_sized_kernel, compute-sanitizer on
# the activation family at the presets' d, and act_params.py again (the library call now
# launches the sized kernel). Everything packed into $OUT/callC.tar.gz.
S=$SECONDS
D=bench/results/2026-12-04_issue11-gelu-decode_NVIDIA-H200
R=$(mktemp -d)
OUT=$R/session SANITIZE=1 SANITIZE_FAMILIES=activation \
  SANITIZE_ARGS="--num-tokens 1,3,16 --dtypes bf16,fp16,fp32 --models llama-3.1-8b,llama-3.1-70b,smollm2-135m" \
  PYTEST_ARGS="-n 15" BENCHES= DEADLINE_S=420 bash bench/gpu_session.sh > $R/session.log 2>&1
echo "gpu_session rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
OUT=$R timeout $((585 - (SECONDS - S))) python3 $D/act_params.py > $R/act_params.log 2>&1
echo "act_params rc $? $((SECONDS - S)) s" | tee -a $R/calls.txt
cat $R/session/summary.txt; tail -2 $R/session/pytest_gpu.log
mkdir -p $R/s && tar xzf $R/session/results.tar.gz -C $R/s && grep -h -E "ERROR SUMMARY|RACECHECK SUMMARY|failure" $R/s/sanitize_*.log
grep -E "torch.compile/this" $R/act_params.log | grep -E "lib call|fixed " | cut -c1-120
tar czf $OUT/callC.tar.gz -C $R .
