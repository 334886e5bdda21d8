#!/usr/bin/env bash
# Call 1 (NOTES item 22): the rms_norm bisect of item 21, then the two branches of item 21
# against main (4dad09d), interleaved with main repeated, then compute-sanitizer on each
# branch's changed families at 1 and 3 tokens.
#   bash bench/ab.sh trees main next/issue11-act-quarter-vectors next/issue11-rms-exact
S=$SECONDS
root=$PWD
export CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
(cd bench/results/2026-12-01_issue11-rmsbisect_NVIDIA-H200 && PYTHONPATH=$root timeout 150 python3 bisect_rms.py) \
  > $OUT/bisect_rms.log 2>&1
echo "bisect rc $? $((SECONDS - S)) s" | tee -a $OUT/calls.txt
A8="silu_and_mul gelu_and_mul silu_and_mul_quant --num-tokens 1,16,64,4096"
A70="silu_and_mul gelu_and_mul --model llama-3.1-70b --num-tokens 1,16,64"
R="rms_norm fused_add_rms_norm --num-tokens 1,16,64,4096"
Q=next-issue11-act-quarter-vectors X=next-issue11-rms-exact
jobs=""; declare -A round
for t in main $Q $X main $Q $X main; do
  n=$(( ${round[$t]:-0} + 1 )); round[$t]=$n
  case $t in
    main) jobs+="$t a8r$n $A8; $t a70r$n $A70; $t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; " ;;
    $Q) jobs+="$t a8r$n $A8; $t a70r$n $A70; " ;;
    $X) jobs+="$t r8r$n $R; $t r70r$n $R --model llama-3.1-70b; " ;;
  esac
done
AB_JOBS=$jobs DEADLINE=250 bash bench/ab.sh run
echo "ab $((SECONDS - S)) s" | tee -a $OUT/calls.txt
CS=/usr/local/cuda/bin/compute-sanitizer
for pair in "$Q activation,quant" "$X norm"; do
  read -r tree fams <<< "$pair"
  for tool in memcheck racecheck; do
    PYTHONPATH=ab/$tree timeout 100 $CS --tool $tool python3 -P bench/sanitize.py --families $fams \
      > $OUT/sanitize-$tree-$tool.log 2>&1
    echo "$tree $tool rc $?: $(grep -E 'failure|ERROR SUMMARY|RACECHECK SUMMARY' $OUT/sanitize-$tree-$tool.log | tr '\n' ' ')" \
      | tee -a $OUT/calls.txt
  done
done
echo "total $((SECONDS - S)) s" | tee -a $OUT/calls.txt
