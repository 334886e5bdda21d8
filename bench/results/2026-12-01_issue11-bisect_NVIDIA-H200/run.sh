#!/usr/bin/env bash
# A/B of the working tree (new) against ab/base (HEAD) by `cupykern sweep`; results in $OUT/ab.
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
R=$OUT/ab; mkdir -p "$R"
T0=$SECONDS
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 250 > "$R/clocks.csv" 2>&1 &
SMI=$!
sw() {  # tree tag args...
  local tree=$1 tag=$2; shift 2
  local pp=$PWD; [ "$tree" != new ] && pp=$PWD/ab/$tree
  local s=$SECONDS
  PYTHONPATH=$pp:/tmp/site timeout $(( ${DEADLINE:-540} - SECONDS > 5 ? ${DEADLINE:-540} - SECONDS : 5 )) \
    python3 -P -m cupykern.cli sweep "$@" --json "$R/$tree-$tag.json" > "$R/$tree-$tag.log" 2>&1
  echo "$tree $tag rc $? $((SECONDS - s)) s" | tee -a "$R/summary.txt"
}
IFS=';' read -ra JOBS <<< "$AB_JOBS"
for job in "${JOBS[@]}"; do eval "sw $job"; done
echo "total $((SECONDS - T0)) s" >> "$R/summary.txt"
kill $SMI 2>/dev/null
tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$R"
