#!/usr/bin/env bash
# A/B of kernel trees by `cupykern sweep`, in one process per (tree, job), one device call.
#
#   bash bench/ab.sh trees REF...   # here (a git checkout): `git archive` each REF's cupykern/
#                                   # and kernels_cu/ into ab/<REF with / as ->; "new" is the
#                                   # working tree itself. ab/ is untracked, so the device call
#                                   # copies it with the working tree (delete it before commits).
#   AB_JOBS="TREE TAG SWEEP-ARGS;..." bash bench/ab.sh run
#                                   # on the device: each job runs `cupykern sweep SWEEP-ARGS`
#                                   # on ab/TREE (or the working tree for "new") into
#                                   # $OUT/ab/TREE-TAG.json and .log; nvidia-smi clocks every
#                                   # 250 ms; all of it packed into $OUT/ab.tar.gz. DEADLINE:
#                                   # seconds for all jobs (default 540).
#   python3 bench/ab_compare.py DIR TREE-TAG,TREE-TAG[,...] ...   # the times side by side
#
# Interleave the trees (base, new, base, new, ...) and repeat one at the end: the runs drift
# by a few hundredths of a microsecond over a call (bench/results/NOTES.md, items 16-19).
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
trees)
  shift
  for ref in "$@"; do
    name=${ref//\//-}
    rm -rf "ab/$name" && mkdir -p "ab/$name"
    git archive "$ref" cupykern kernels_cu | tar x -C "ab/$name"
    echo "ab/$name <- $(git rev-parse --short "$ref") ($ref)"
  done
  ;;
run)
  : "${OUT:?run on the device: \$OUT is where results go}"
  export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
  # Liger and platformdirs wheels carried in .whl (gpu_session.sh installs them the same way).
  [ -d .whl ] && pip install -q --target /tmp/site .whl/*.whl > /dev/null 2>&1
  R=$OUT/ab; mkdir -p "$R"
  T0=$SECONDS
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$R/clocks.csv" 2>&1 &
  SMI=$!
  sweep() {  # TREE TAG SWEEP-ARGS...
    local tree=$1 tag=$2; shift 2
    local root=$PWD; [ "$tree" != new ] && root=$PWD/ab/$tree
    local s=$SECONDS left=$(( ${DEADLINE:-540} - (SECONDS - T0) ))
    PYTHONPATH=$root:/tmp/site timeout $(( left > 5 ? left : 5 )) \
      python3 -P -m cupykern.cli sweep "$@" --json "$R/$tree-$tag.json" > "$R/$tree-$tag.log" 2>&1
    echo "$tree $tag rc $? $((SECONDS - s)) s" | tee -a "$R/summary.txt"
  }
  IFS=';' read -ra jobs <<< "${AB_JOBS:?AB_JOBS: \"TREE TAG SWEEP-ARGS;...\"}"
  for job in "${jobs[@]}"; do eval "sweep $job"; done
  echo "total $((SECONDS - T0)) s" >> "$R/summary.txt"
  kill $SMI 2>/dev/null
  tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$R"
  ;;
*)
  sed -n '2,18p' "$0"; exit 2
  ;;
esac
