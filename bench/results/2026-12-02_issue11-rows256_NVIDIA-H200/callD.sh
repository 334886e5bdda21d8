#!/usr/bin/env bash
# Call D (NOTES item 27): the decode points below 1.00 of torch.compile in the 59c3779
# peers run (gelu_and_mul and silu_and_mul at 1-16 tokens, fused_add_rms_norm 70b at
# 16 and 64), three peers runs in a row, torch.compile alone, both presets: how far
# each side's time moves from run to run.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl  # platformdirs
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=/tmp/ck-cache
S=$SECONDS
for run in 1 2 3; do
  timeout 120 python3 bench/peers.py --num-tokens 1,16,64 --ops fused_add_rms_norm,silu_and_mul,gelu_and_mul \
    --peers torch.compile --out $OUT/run$run > $OUT/run$run.log 2>&1
  echo "run $run rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
done
