"""NOTES item 61, call 17's open question: after a long stretch of other work, rms_norm's
layouts holding their rows read 3-9 % slow in their first one or two time_cold runs (of
50 calls), the reread layout never. How long does it last, in calls or in time, and does
idling cause it too? llama-3.1-8b, 1024 rows of 4096, bf16: after each condition below,
twelve time_cold runs of 10 calls each, alternating lib (128 x 4 held) and reread (256 x 2
rereading), each run's median and the host seconds since the condition ended:
  steady   nothing (after a warm-up of both);
  liger    Liger's rms_norm timed as peers.py times it (time_cold, 50 calls);
  gemm     50 torch bf16 matmuls 1024 x 4096 x 4096;
  idle     the GPU idle for 50 ms (time.sleep after a synchronize);
  idle500  idle for 500 ms.
Writes first_timings_probe_<tag>.json. Seed 20261207.

    python first_timings_probe.py [--tag T] [--out DIR]
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
from bench import peers, variants  # noqa: E402
from cupykern import bfloat16, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
SEED, ROWS, RUNS = 20261207, 1024, 12

model = models.get("llama-3.1-8b")
spec = all_specs()["rms_norm"].for_model(model)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "conditions": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    inputs = spec.make_inputs(np.random.default_rng(SEED), ROWS, model.hidden_size, bfloat16)
    fns = {"lib": variants.under({}, lambda: spec.run(inputs)),
           "reread": variants.under({"REREAD": {"rms_norm": (1, 4096, 8192)}}, lambda: spec.run(inputs))}
    liger = peers._prepare(torch, peers._liger(torch)["rms_norm"][""], peers._copy_inputs(inputs))
    a = torch.randn(ROWS, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for f in (*fns.values(), liger, liger, lambda: a @ b):
        f()
    for f in fns.values():
        timing.time_cold(f, repeat=50)
    stream.synchronize()
    conditions = {"steady": lambda: None, "liger": lambda: timing.time_cold(liger, repeat=50),
                  "gemm": lambda: [a @ b for _ in range(50)], "idle": lambda: time.sleep(0.05),
                  "idle500": lambda: time.sleep(0.5)}
    for label, condition in conditions.items():
        stream.synchronize()
        condition()
        stream.synchronize()
        t0 = time.perf_counter()
        runs = []
        for i in range(RUNS):
            name = "lib" if i % 2 == 0 else "reread"
            us = timing.time_cold(fns[name], warmup=0, repeat=10).median_us
            runs.append({"variant": name, "us": us, "host_s": time.perf_counter() - t0})
        results["conditions"].append({"after": label, "runs": runs})
        print(f"after {label:8s}: " + "  ".join(f"{r['variant'][0]}{r['us']:.2f}@{1e3 * r['host_s']:.0f}ms" for r in runs),
              flush=True)
json.dump(results, open(os.path.join(OUT, f"first_timings_probe_{TAG}.json"), "w"), indent=1)
