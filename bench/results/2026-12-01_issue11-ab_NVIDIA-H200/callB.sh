#!/usr/bin/env bash
# Call B: the row and RoPE kernels' branches against main, interleaved, then racecheck of
# the scratch-pair tree (NOTES item 20).
R="rms_norm fused_add_rms_norm layer_norm softmax apply_rope qk_rms_norm_rope --num-tokens 1,16,64,4096"
jobs=""
for t in main next-issue11-scratch-pair next-issue11-int32-softmax next-issue11-int32-rope \
         main next-issue11-scratch-pair next-issue11-int32-softmax next-issue11-int32-rope main; do
  n=$(( $(grep -o "$t r8" <<< "$jobs" | wc -l) + 1 ))
  jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; "
done
AB_JOBS=$jobs DEADLINE=${DEADLINE:-420} bash bench/ab.sh run
export CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
CS=/usr/local/cuda/bin/compute-sanitizer
for tool in memcheck racecheck; do  # at 1 and 3 tokens (sanitize.py's default)
  PYTHONPATH=ab/next-issue11-scratch-pair timeout 120 $CS --tool $tool \
    python3 -P bench/sanitize.py --families norm,softmax,row_reduce,quant \
    > $OUT/sanitize-scratch-pair-$tool.log 2>&1
  echo "$tool rc $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize-scratch-pair-$tool.log)"
done
