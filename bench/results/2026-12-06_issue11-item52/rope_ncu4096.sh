#!/usr/bin/env bash
# Item 52: rope_ncu4096.py under Nsight Compute, every cache flushed before each kernel
# (--cache-control all: the peers' cold L2), clocks left alone (--clock-control none, as the
# device notes ask). The report stays in /tmp (its size); its details and raw pages land
# in $OUT/ncu. From the repo root:
#   run(command="bash bench/results/2026-12-06_issue11-item52/rope_ncu4096.sh", carry=[".whl"])
# (.whl holds Liger-Kernel's wheel; bench/gpu_session.sh's PEERS step installs it the same way).
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-$PWD/.out}
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/site/liger_kernel ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupykern-kernel-cache}
D=bench/results/2026-12-06_issue11-item52
mkdir -p "$OUT/ncu"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU; commit $(git rev-parse --short HEAD 2>/dev/null)"
timeout "${NCU_TIMEOUT:-300}" "$NCU" --profile-from-start off --clock-control none --cache-control all --nvtx \
  --set full --import-source no -o /tmp/rope_ncu4096 -f python3 "$D/rope_ncu4096.py" "$@" 2>&1 | tail -30
"$NCU" -i /tmp/rope_ncu4096.ncu-rep --page details --print-nvtx-rename kernel > "$OUT/ncu/details.txt" 2>&1
"$NCU" -i /tmp/rope_ncu4096.ncu-rep --page raw --csv > "$OUT/ncu/raw.csv" 2>&1
ls -la "$OUT/ncu"
grep -E "^  [A-Za-z_]|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|L2 Hit Rate|Memory Throughput|Elapsed Cycles|Block Size|Grid Size|Executed Instructions  " \
  "$OUT/ncu/details.txt" | head -200
