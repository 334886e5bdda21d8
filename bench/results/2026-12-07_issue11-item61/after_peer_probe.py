"""NOTES item 61, calls 5-7 and 15: rms_norm's layouts holding their rows read 5-10 % slower
after Liger's rms_norm was timed in the same process, the reread layout did not. Which
kernel before them does it, and for how long? llama-3.1-8b, 1024 rows of 4096, bf16, cold
L2 (timing.time_cold, 50 calls): blocks of [lib (128 x 4), decode (256 x 2 held), reread
(256 x 2 rereading)] timed three times in a row, after each of these in turn:
  start         nothing (first block of the process after warm-up);
  liger1        one call of Liger's rms_norm (1024 x 4096);
  liger_timed   Liger's rms_norm timed as the probes time it (time_cold, 50 calls);
  quiet         the blocks again, nothing between;
  gemm          50 torch bf16 matmuls 1024 x 4096 x 4096 (cuBLAS), as a model's step has;
  torch_compile torch.compile's rms_norm (out of place) timed (time_cold, 50 calls).
Prints each block's medians; writes after_peer_probe_<tag>.json. Seed 20261207.

    python after_peer_probe.py [--tag T] [--out DIR]
"""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import peers, variants  # noqa: E402
from cupykern import bfloat16, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
SEED, ROWS = 20261207, 1024
VARIANTS = {"lib": {}, "decode": {"DECODE_FILL_SHARE_DEFAULT": float("inf")},
            "reread": {"REREAD": {"rms_norm": (1, 4096, 8192)}}}

model = models.get("llama-3.1-8b")
spec = all_specs()["rms_norm"].for_model(model)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "blocks": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    inputs = spec.make_inputs(np.random.default_rng(SEED), ROWS, model.hidden_size, bfloat16)
    fns = {name: variants.under(values, lambda: spec.run(inputs)) for name, values in VARIANTS.items()}
    liger = peers._prepare(torch, peers._liger(torch)["rms_norm"][""], peers._copy_inputs(inputs))
    compiled = peers._prepare(torch, peers._torch_compile(torch)["rms_norm"]["out of place"], peers._copy_inputs(inputs))
    a = torch.randn(ROWS, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for f in (*fns.values(), liger, liger, compiled, compiled, lambda: a @ b):
        f()
    stream.synchronize()
    before = {"start": lambda: None, "liger1": liger,
              "liger_timed": lambda: timing.time_cold(liger, repeat=50),
              "quiet": lambda: None, "gemm": lambda: [a @ b for _ in range(50)],
              "torch_compile": lambda: timing.time_cold(compiled, repeat=50)}
    for label, run_before in before.items():
        run_before()
        stream.synchronize()
        for block in range(3):
            med = {name: timing.time_cold(f, repeat=50).median_us for name, f in fns.items()}
            results["blocks"].append({"after": label, "block": block, "us": med})
            print(f"after {label:14s} block {block}: " + "  ".join(f"{n} {v:.2f}" for n, v in med.items()), flush=True)
json.dump(results, open(os.path.join(OUT, f"after_peer_probe_{TAG}.json"), "w"), indent=1)
