"""NOTES item 61, calls 5-7 and 15: rms_norm's layouts holding their rows read 5-10 % slower
after Liger's rms_norm was timed in the same process, the reread layout did not. Which
kernel before them does it, and for how long? llama-3.1-8b, 1024 rows of 4096, bf16, cold
L2 (timing.time_cold). Variants: lib (the plan, 128 x 4 held), decode (256 x 2 held) and
reread (256 x 2 rereading), through the public op under cupykern.plans' constants.

Blocks (default; call 17): blocks of [lib, decode, reread], each timed with 50 calls,
three times in a row after each of these in turn:
  start         nothing (first block of the process after warm-up);
  liger1        one call of Liger's rms_norm (1024 x 4096);
  liger_timed   Liger's rms_norm timed as the probes time it (time_cold, 50 calls);
  quiet         the blocks again, nothing between;
  gemm          50 torch bf16 matmuls 1024 x 4096 x 4096 (cuBLAS), as a model's step has;
  torch_compile torch.compile's rms_norm (out of place) timed (time_cold, 50 calls).

--first-timings (call 17's open question; item 62): how long the slow first timings
last, in calls or in time, and what causes them. After each condition (steady /
steady2: nothing; liger: Liger timed; gemm / gemm1: 50 / 1 matmuls; liger1: one Liger
call; flushes: 50 of time_cold's L2 flushes alone; hold5ms: its spinning kernel alone;
carve100 / carve0: 50 launches of a small kernel preferring 100 / 0 % shared memory;
idle / idle500: the GPU idle for 50 / 500 ms), twelve time_cold runs of 10 calls each
(no warm-up), alternating lib and reread: each run's median and every call's time, and
the host seconds since the condition ended.

Prints each block's or run's medians; writes after_peer_probe_<tag>.json (or
first_timings_probe_<tag>.json). Seed 20261207.

    python after_peer_probe.py [--first-timings] [--tag T] [--out DIR]
"""
import json
import os
import sys
import time
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import variants  # noqa: E402
from cupykern import bfloat16, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
FIRST_TIMINGS = "--first-timings" in sys.argv
SEED, ROWS, RUNS = 20261207, 1024, 12
VARIANTS = {"lib": {}, "decode": {"DECODE_FILL_SHARE_DEFAULT": float("inf")},
            "reread": {"REREAD": {"rms_norm": (1, 4096, 8192)}}}


def blocks(fns, liger, compiled, matmuls):
    """Call 17's blocks: [(condition, block, {variant: median us})]."""
    before = {"start": lambda: None, "liger1": liger,
              "liger_timed": lambda: timing.time_cold(liger, repeat=50),
              "quiet": lambda: None, "gemm": matmuls,
              "torch_compile": lambda: timing.time_cold(compiled, repeat=50)}
    out = []
    for label, run_before in before.items():
        run_before()
        stream.synchronize()
        for block in range(3):
            med = {name: timing.time_cold(f, repeat=50).median_us for name, f in fns.items()}
            out.append({"after": label, "block": block, "us": med})
            print(f"after {label:14s} block {block}: " + "  ".join(f"{n} {v:.2f}" for n, v in med.items()), flush=True)
    return out


_CARVE_SOURCE = r"""
#define TOUCH(name) extern "C" __global__ void name(float* out) {     \
  __shared__ float s[256];                                           \
  s[threadIdx.x] = threadIdx.x;                                      \
  __syncthreads();                                                   \
  if (threadIdx.x == 0) out[blockIdx.x] = s[blockIdx.x % 256];       \
}
TOUCH(touch_carve100)
TOUCH(touch_carve0)
"""


def carveout_kernels(carveout):
    """50 launches over every SM of a kernel preferring ``carveout`` % of L1 as shared
    memory (item 46: the carveout a kernel leaves outlasts it)."""
    kernel = cupy.RawModule(code=_CARVE_SOURCE).get_function(f"touch_carve{carveout}")
    kernel.preferred_shared_memory_carveout = carveout
    blocks = 8 * cupy.cuda.Device().attributes["MultiProcessorCount"]
    out = cupy.empty(blocks, dtype=np.float32)

    def run():
        for _ in range(50):
            kernel((blocks,), (256,), (out,))
    return run


def first_timings(fns, liger, matmuls):
    """Twelve short runs, lib and reread in turn, after each condition; every call's time."""
    for f in (fns["lib"], fns["reread"]):
        timing.time_cold(f, repeat=50)
    flusher = timing._L2Flusher()
    conditions = {"steady": lambda: None, "liger": lambda: timing.time_cold(liger, repeat=50),
                  "gemm": matmuls, "gemm1": lambda: matmuls(1), "liger1": liger,
                  "flushes": lambda: [flusher.flush(stream) for _ in range(50)],
                  "hold5ms": lambda: timing.hold_gpu(5e-3, stream),
                  "carve100": carveout_kernels(100), "carve0": carveout_kernels(0),
                  "idle": lambda: time.sleep(0.05), "idle500": lambda: time.sleep(0.5),
                  "steady2": lambda: None}
    out = []
    for label, condition in conditions.items():
        stream.synchronize()
        condition()
        stream.synchronize()
        t0 = time.perf_counter()
        runs = []
        for i in range(RUNS):
            name = "lib" if i % 2 == 0 else "reread"
            calls = list(timing.time_cold(fns[name], warmup=0, repeat=10).samples_us)
            runs.append({"variant": name, "us": float(np.median(calls)), "calls_us": calls,
                         "host_s": time.perf_counter() - t0})
        out.append({"after": label, "runs": runs})
        print(f"after {label:8s}: " + "  ".join(f"{r['variant'][0]}{r['us']:.2f}@{1e3 * r['host_s']:.0f}ms"
                                              for r in runs), flush=True)
        for r in runs[:2]:
            print(f"    {r['variant']:6s} calls: " + " ".join(f"{c:.2f}" for c in r["calls_us"]), flush=True)
    return out


model = models.get("llama-3.1-8b")
spec = all_specs()["rms_norm"].for_model(model)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?")}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    inputs = spec.make_inputs(np.random.default_rng(SEED), ROWS, model.hidden_size, bfloat16)
    fns = {name: variants.under(values, lambda: spec.run(inputs)) for name, values in VARIANTS.items()}
    liger = variants.peer_call("rms_norm", "liger", "", inputs)
    compiled = variants.peer_call("rms_norm", "torch.compile", "out of place", inputs)
    a = torch.randn(ROWS, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def matmuls(count=50):
        for _ in range(count):
            a @ b

    for f in (*fns.values(), liger, liger, compiled, compiled, lambda: a @ b):  # one matmul, as call 17
        f()
    stream.synchronize()
    if FIRST_TIMINGS:
        results["conditions"], name = first_timings(fns, liger, matmuls), "first_timings_probe"
    else:
        results["blocks"], name = blocks(fns, liger, compiled, matmuls), "after_peer_probe"
json.dump(results, open(os.path.join(OUT, f"{name}_{TAG}.json"), "w"), indent=1)
