#!/usr/bin/env bash
# SmolLM2-135M end to end on a GPU machine that has no internet and no `gguf` package.
#
# The GGUF (98,362,432 bytes) is larger than what one device call carries (64 MiB with the
# working tree, ~18 MB of it tracked files), so it travels in three parts of at most 32 MiB
# over three consecutive calls; the gguf wheel travels in .whl/. The machine stays warm
# only ~30 s after a call, so make each call right after the one before (if it went cold,
# the next stage says so: redo them from stage1).
#
#   here, once:   [PYTHON=.venv/bin/python] bash bench/llm_on_gpu.sh prepare
#                 -> .whl/gguf-0.19.0-py3-none-any.whl (+ pyyaml, imported by gguf; the
#                    image has it, the wheel is insurance), .llm_parts/part1, part2, part3
#                 (.whl/ and .llm_parts/ are in .git/info/exclude: never committed)
#   device call 1 (carry [".llm_parts/part1"]):
#                 bash bench/llm_on_gpu.sh stage1
#                 -> copies part1 to ~/cupykern-llm/held (outside the working tree)
#   device call 2 (carry [".llm_parts/part2"]):
#                 bash bench/llm_on_gpu.sh stage2   -> appends part2 to it
#   device call 3 (carry [".llm_parts/part3", ".whl"]):
#                 bash bench/llm_on_gpu.sh stage3
#                 -> joins the parts into $CUPYKERN_CACHE_DIR/models/, checks the
#                    SHA-256 (cupykern.llm.fetch.verify), installs the wheels into
#                    /tmp/site, runs tests/test_llm.py (GPU and CPU tests) and
#                    `generate` in fp16/bf16 with kernels and with plain CuPy; logs in $OUT.
#
# STAGE3_TESTS / GENERATE_TOKENS / GENERATE_ARGS (';'-separated argument lists) override
# what stage 3 runs.
set -u -o pipefail
cd "$(dirname "$0")/.."

GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PART_BYTES=$((32 * 1024 * 1024))
PARTS=.llm_parts
HOLD=${HOME}/cupykern-llm

prepare() {
  set -e
  grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
  grep -qx "/${PARTS}/" .git/info/exclude || echo "/${PARTS}/" >> .git/info/exclude
  mkdir -p .whl "$PARTS"
  for req in gguf==0.19.0 pyyaml==6.0.4; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$req"
  done
  gguf_file=$("${PYTHON:-python3}" -m cupykern.llm.cli fetch-model smollm2)
  rm -f "$PARTS"/part*
  split -b "$PART_BYTES" -a 1 --numeric-suffixes=1 "$gguf_file" "$PARTS/part"
  ls -l .whl "$PARTS"
}

# A carried part of the wrong size (a truncated copy, another split) would fail the
# SHA-256 only at stage 3: refused here, with the mend.
check_part() {  # STAGE PART
  [ -s "$PARTS/$2" ] || { echo "$1: $PARTS/$2 missing: carry it ([\"$PARTS/$2\"])" >&2; exit 2; }
  [ "$(stat -c %s "$PARTS/$2")" -eq "$PART_BYTES" ] \
    || { echo "$1: $PARTS/$2 is not $PART_BYTES bytes: run \`bash bench/llm_on_gpu.sh prepare\` again here" >&2; exit 2; }
}

stage1() {
  set -e
  check_part stage1 part1
  mkdir -p "$HOLD"
  cp "$PARTS/part1" "$HOLD/held"
  ls -l "$HOLD"
}

stage2() {
  set -e
  [ -s "$HOLD/held" ] || { echo "stage2: $HOLD/held missing: the machine went cold; redo stage1" >&2; exit 2; }
  check_part stage2 part2
  [ "$(stat -c %s "$HOLD/held")" -eq "$PART_BYTES" ] || { echo "stage2: $HOLD/held is not part1 alone: redo stage1" >&2; exit 2; }
  cat "$PARTS/part2" >> "$HOLD/held"
  ls -l "$HOLD"
}

stage3() {
  OUT=${OUT:-$PWD/.out}
  mkdir -p "$OUT"
  [ "$(stat -c %s "$HOLD/held" 2>/dev/null || echo 0)" -eq $((2 * PART_BYTES)) ] \
    || { echo "stage3: $HOLD/held is not part1 + part2: the machine went cold; redo stage1 and stage2" >&2; exit 2; }
  [ -s "$PARTS/part3" ] || { echo "stage3: $PARTS/part3 missing: carry it with .whl" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 2
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  export CUPYKERN_CACHE_DIR=${CUPYKERN_CACHE_DIR:-$HOME/.cache/cupykern}
  export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupykern-kernel-cache}
  mkdir -p "$CUPYKERN_CACHE_DIR/models"
  target="$CUPYKERN_CACHE_DIR/models/$GGUF_NAME"
  cat "$HOLD/held" "$PARTS/part3" > "$target"
  python3 -c "
from pathlib import Path
from cupykern.llm import fetch
fetch.verify(Path('$target'), fetch.source('smollm2'))
print('joined and verified:', '$target')" || { rm -f "$target"; echo "stage3: the joined file failed its SHA-256 (removed): run prepare again here, then the three stages" >&2; exit 2; }

  status=0
  { nvidia-smi --query-gpu=name,driver_version --format=csv; \
    python3 -c "import cupy, gguf, tokenizers; print('cupy', cupy.__version__, 'gguf ok, tokenizers', tokenizers.__version__)"; } \
    2>&1 | tee "$OUT/llm_environment.txt"
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider -rA --durations=10 ${STAGE3_TESTS:-tests/test_llm.py} 2>&1 \
    | tee "$OUT/pytest_llm.log" || status=1
  n=${GENERATE_TOKENS:-64}
  # The captured-graph decode (the default) in both dtypes, then the eager paths beside it.
  IFS=';' read -r -a runs <<< "${GENERATE_ARGS:-"--dtype fp16 --ops cupykern;--dtype bf16 --ops cupykern;\
--dtype fp16 --ops cupykern --no-graph --no-stage-times;--dtype bf16 --ops cupykern --no-graph --no-stage-times;\
--dtype fp16 --ops plain --no-stage-times"}"
  for args in "${runs[@]}"; do
    name=$(echo "$args" | tr -d '-' | tr ' ' '_')
    # shellcheck disable=SC2086
    python3 -m cupykern.llm.cli generate --max-new-tokens "$n" $args 2>&1 | tee "$OUT/generate_$name.log" || status=1
  done
  python3 -m cupykern.llm.cli generate --chat --max-new-tokens "$n" "What is the capital of France?" 2>&1 \
    | tee "$OUT/generate_chat.log" || status=1
  exit $status
}

case "${1:-}" in
  prepare) prepare ;;
  stage1) stage1 ;;
  stage2) stage2 ;;
  stage3) stage3 ;;
  *) echo "usage: bash bench/llm_on_gpu.sh prepare|stage1|stage2|stage3 (see the header)" >&2; exit 2 ;;
esac
