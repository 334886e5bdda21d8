#!/usr/bin/env bash
# SmolLM2-135M end to end on a GPU machine that has no internet and no `gguf` package.
#
# The GGUF (98,362,432 bytes) is larger than what one device call carries (64 MiB with the
# working tree, whose tracked files are 47.4 MiB at 275fc9a and growing), so it travels in
# parts of PART_MIB MiB (default 14: seven parts, the last 9.8 MiB; lower it as the tree
# grows, tree + part + .whl under 64 MiB) over consecutive calls; the gguf wheel
# travels in .whl/. The machine stays warm only ~30 s after a call, so make each call
# right after the one before (if it went cold, the next stage says so: redo from part 1).
#
#   here, once:   [PYTHON=.venv/bin/python] [PART_MIB=14] bash bench/llm_on_gpu.sh prepare
#                 -> .whl/gguf-0.19.0-py3-none-any.whl (+ pyyaml, imported by gguf; the
#                    image has it, the wheel is insurance), .llm_parts/part1 .. partN
#                 (.whl/ and .llm_parts/ are in .git/info/exclude: never committed)
#   device calls K = 1 .. N-1 (carry [".llm_parts/partK"]), one after another:
#                 bash bench/llm_on_gpu.sh part K
#                 -> appends part K to ~/cupykern-llm/held (outside the working tree)
#   device call N (carry [".llm_parts/partN", ".whl"]):
#                 bash bench/llm_on_gpu.sh run N
#                 -> joins the parts into $CUPYKERN_CACHE_DIR/models/, checks the
#                    SHA-256 (cupykern.llm.fetch.verify), installs the wheels into
#                    /tmp/site, runs tests/test_llm.py (GPU and CPU tests) and
#                    `generate` in fp16/bf16 with kernels and with plain CuPy; logs in $OUT.
#
# STAGE3_TESTS / GENERATE_TOKENS / GENERATE_ARGS (';'-separated argument lists) override
# what the run stage runs.
set -u -o pipefail
cd "$(dirname "$0")/.."

GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PART_BYTES=$((${PART_MIB:-14} * 1024 * 1024))
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
# SHA-256 only at the run stage: refused here, with the mend.
check_part() {  # STAGE K
  [ -s "$PARTS/part$2" ] || { echo "$1: $PARTS/part$2 missing: carry it ([\"$PARTS/part$2\"])" >&2; exit 2; }
  [ "$(stat -c %s "$PARTS/part$2")" -eq "$PART_BYTES" ] \
    || { echo "$1: $PARTS/part$2 is not $PART_BYTES bytes: run \`bash bench/llm_on_gpu.sh prepare\` again here" >&2; exit 2; }
}

# held must be parts 1 .. K-1 before part K is added (else the machine went cold).
check_held() {  # STAGE K
  local want=$(( ($2 - 1) * PART_BYTES ))
  [ "$(stat -c %s "$HOLD/held" 2>/dev/null || echo 0)" -eq "$want" ] \
    || { echo "$1: $HOLD/held is not parts 1 .. $(( $2 - 1 )): the machine went cold; redo from part 1" >&2; exit 2; }
}

part() {  # K
  set -e
  check_part "part $1" "$1"
  mkdir -p "$HOLD"
  [ "$1" -eq 1 ] && rm -f "$HOLD/held"
  check_held "part $1" "$1"
  cat "$PARTS/part$1" >> "$HOLD/held"
  ls -l "$HOLD"
}

run() {  # N: the last part, carried with .whl
  OUT=${OUT:-$PWD/.out}
  mkdir -p "$OUT"
  check_held "run $1" "$1"
  [ -s "$PARTS/part$1" ] || { echo "run $1: $PARTS/part$1 missing: carry it with .whl" >&2; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 2
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
  export CUPYKERN_CACHE_DIR=${CUPYKERN_CACHE_DIR:-$HOME/.cache/cupykern}
  export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupykern-kernel-cache}
  mkdir -p "$CUPYKERN_CACHE_DIR/models"
  target="$CUPYKERN_CACHE_DIR/models/$GGUF_NAME"
  cat "$HOLD/held" "$PARTS/part$1" > "$target"
  python3 -c "
from pathlib import Path
from cupykern.llm import fetch
fetch.verify(Path('$target'), fetch.source('smollm2'))
print('joined and verified:', '$target')" || { rm -f "$target"; echo "run: the joined file failed its SHA-256 (removed): run prepare again here, then every part" >&2; exit 2; }

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
  part) part "${2:?part K}" ;;
  run) run "${2:?run N}" ;;
  *) echo "usage: bash bench/llm_on_gpu.sh prepare | part K | run N (see the header)" >&2; exit 2 ;;
esac
