#!/usr/bin/env bash
# A/B of kernel trees by `cupykern sweep`, in one process per (tree, job), one device call.
#
#   bash bench/ab.sh trees REF...   # in the checkout the device call copies: `git archive`
#                                   # each REF's cupykern/ and kernels_cu/ into ab/NAME (NAME:
#                                   # REF without a leading origin/, / as -) with its commit in
#                                   # ab/NAME/COMMIT; a REF missing locally is taken from
#                                   # origin/REF. "new" names the working tree itself.
#                                   # AB_PATHS: other pathspecs to archive (e.g. "cupykern
#                                   # kernels_cu tests bench pyproject.toml :!bench/results"
#                                   # to run a branch's own tests and benches there).
#                                   # ab/ is untracked, so the call copies it with the working
#                                   # tree: delete it before you commit.
#   AB_JOBS="TREE TAG SWEEP-ARGS; TREE TAG SWEEP-ARGS" bash bench/ab.sh run
#                                   # on the device: each job runs `cupykern sweep SWEEP-ARGS`
#                                   # on ab/TREE (or the working tree for "new") into
#                                   # $OUT/ab/TREE-TAG.json and .log (its commit field: the
#                                   # tree's); nvidia-smi clocks every 250 ms; all of it
#                                   # packed into $OUT/ab.tar.gz, also when cut short.
#                                   # DEADLINE: seconds for all jobs from the start (default
#                                   # 540, under a call's 600); a job with no time left is
#                                   # skipped and says so in summary.txt.
#   python3 bench/ab_compare.py DIR TREE-TAG,TREE-TAG[,...] ...   # the times side by side
#
# Interleave the trees (base, new, base, new, ...) and repeat one at the end: the runs drift
# by a few hundredths of a microsecond over a call (bench/results/NOTES.md, items 16-19). An
# 8b activation job over 1-16384 tokens takes about 50 s, a 70b one about 110 s.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS

tree_name() { local name=${1#origin/}; echo "${name//\//-}"; }

case "${1:-}" in
trees)
  shift
  for ref in "$@"; do
    commit=$(git rev-parse -q --verify "$ref^{commit}" || git rev-parse -q --verify "origin/$ref^{commit}") \
      || { echo "ab.sh: no commit $ref (nor origin/$ref)" >&2; exit 1; }
    name=$(tree_name "$ref")
    rm -rf "ab/$name" && mkdir -p "ab/$name"
    # shellcheck disable=SC2086  # AB_PATHS is a list of pathspecs
    git archive "$commit" ${AB_PATHS:-cupykern kernels_cu} | tar x -C "ab/$name" \
      || { echo "ab.sh: archiving $ref failed" >&2; exit 1; }
    git rev-parse --short "$commit" > "ab/$name/COMMIT"
    echo "ab/$name <- $(cat "ab/$name/COMMIT") ($ref)"
  done
  ;;
run)
  : "${OUT:?run on the device: \$OUT is where results go}"
  export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=/tmp/ck-cache CUPYKERN_CACHE_DIR=/tmp/ck-user
  # Jobs are split at ';' (a line break is a space); blank ones are ignored.
  IFS=';' read -ra jobs <<< "$(tr '\n' ' ' <<< "${AB_JOBS:?AB_JOBS: \"TREE TAG SWEEP-ARGS; ...\"}")"
  for job in "${jobs[@]}"; do  # every tree there before anything is timed
    read -r tree _ <<< "$job"
    [ -z "${tree:-}" ] || [ "$tree" = new ] || [ -d "ab/$(tree_name "$tree")/cupykern" ] \
      || { echo "ab.sh: no tree ab/$(tree_name "$tree") (run \`bash bench/ab.sh trees $tree\` first)" >&2; exit 1; }
  done
  R=$OUT/ab; mkdir -p "$R"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 250 > "$R/clocks.csv" 2>&1 &
  SMI=$!
  finish() {
    kill "$SMI" 2>/dev/null
    echo "total $((SECONDS - T0)) s" >> "$R/summary.txt"
    tar czf "$OUT/ab.tar.gz" -C "$OUT" ab && rm -rf "$R"
  }
  trap finish EXIT
  sweep() {  # TREE TAG SWEEP-ARGS...
    local tree tag=$2 root=$PWD commit
    tree=$(tree_name "$1"); shift 2
    [ "$tree" != new ] && root=$PWD/ab/$tree
    commit=$(cat "$root/COMMIT" 2>/dev/null || echo "${CUPYKERN_COMMIT:-}")  # new: the checkout's own
    local s=$SECONDS left=$(( ${DEADLINE:-540} - (SECONDS - T0) ))
    if [ "$left" -le 5 ]; then
      echo "$tree $tag skipped: no time left" | tee -a "$R/summary.txt"
      return
    fi
    CUPYKERN_COMMIT=$commit PYTHONPATH=$root timeout -k 5 "$left" \
      python3 -P -m cupykern.cli sweep "$@" --json "$R/$tree-$tag.json" > "$R/$tree-$tag.log" 2>&1
    echo "$tree $tag rc $? $((SECONDS - s)) s" | tee -a "$R/summary.txt"
  }
  for job in "${jobs[@]}"; do
    [[ $job =~ [^[:space:]] ]] || continue
    eval "sweep $job"
  done
  ;;
*)
  sed -n '2,24p' "$0"; exit 2
  ;;
esac
