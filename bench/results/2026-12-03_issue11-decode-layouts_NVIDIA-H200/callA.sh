#!/usr/bin/env bash
# Call A (NOTES item 34): apply_rope's blocks and grids, qk at 3 blocks an SM, the gated
# activations at decode sizes relaunched, and what torch.compile launches there.
S=$SECONDS
D=bench/results/2026-12-03_issue11-decode-layouts_NVIDIA-H200
export PYTHONPATH=$PWD CUPY_CACHE_DIR=/tmp/cupykern-kernel-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader | tee $OUT/gpu.txt
for s in rope_layouts qk_lb3 act_decode; do
  OUT=$OUT timeout 150 python3 $D/$s.py > $OUT/$s.log 2>&1
  echo "$s rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt; grep -c DIFFER $OUT/$s.log
done
TORCH_LOGS=output_code OUT=$OUT timeout 200 python3 $D/inductor_decode.py > $OUT/inductor_decode.log 2> $OUT/inductor_code.log
echo "inductor rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
grep "graph" $OUT/inductor_decode.log | cut -c1-600
