#!/usr/bin/env bash
# NOTES item 66: one call on whichever card comes, from the repository root (carry .whl;
# CUPYKERN_COMMIT set to main's sha):
#   1. on an H100 only: item 53's rope_blocks4096.py past the ends (8b, 70b; the far end
#      at 0, item 65's rope_map.py) and rope_token_prefill.py on qwen2.5-7b, gemma-2-9b,
#      phi-3-mini past their ends ($OUT/map);
#   2. compute-sanitizer memcheck and racecheck on the rope family with the far end at 64
#      tokens an SM (sanitize_far.py; 3600 / 5000 tokens past every other end; bf16, fp16;
#      70b, qwen2.5-7b, gemma-2-9b, phi-3-mini and the default 8b);
#   3. the GPU suite but the model test (-n 15), on an H200 with step 2's second script
#      after it ($OUT/all).
# Results: $OUT/san_*.log and gpu_session.sh's results.tar.gz, summary.txt, pytest_gpu.log.
# DEADLINE_S (default 580): the seconds the whole call may take.
cd "$(dirname "$0")/../../.."
D=bench/results/2026-12-07_issue11-item66
MAP=bench/results/2026-12-07_issue11-item65/rope_map.py
TAG=${TAG:-x66}
BENCHES="$MAP rope_token_prefill.py --models qwen2.5-7b,gemma-2-9b,phi-3-mini --sizes 3584,4092,4608,6144,8192,12288,16384 --tag $TAG"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
  # The H100's map first: the H200 has read 8b's and 70b's already (item 64).
  BENCHES="$MAP rope_blocks4096.py --tag $TAG --sizes 3072,3584,4096,4608,5120,6144,8192,10240,12288,16384;$BENCHES"
  OUT=$OUT/map TESTS= BENCHES="$BENCHES" DEADLINE_S=$(( ${DEADLINE_S:-580} - SECONDS )) bash bench/gpu_session.sh
  BENCHES=
fi
for tool in memcheck racecheck; do
  start=$SECONDS
  timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool "$tool" --error-exitcode 3 python3 $D/sanitize_far.py 64 \
    --families rope --num-tokens 3600,5000 --dtypes bf16,fp16 \
    --models llama-3.1-70b,qwen2.5-7b,gemma-2-9b,phi-3-mini > "$OUT/san_$tool.log" 2>&1
  echo "sanitize $tool (far end 64): rc $? in $((SECONDS - start)) s"; tail -2 "$OUT/san_$tool.log"
done
OUT=$OUT/all TESTS="tests --ignore=tests/test_llm.py" PYTEST_ARGS="-n 15" BENCHES="$BENCHES" \
  DEADLINE_S=$(( ${DEADLINE_S:-580} - SECONDS )) bash bench/gpu_session.sh
