"""NOTES item 46, call 3: the 256-row points with the kernel before the timed one fixed
(call 2's part B: a kernel costs 0.4-1 us more when the carveout of the kernel before it
differs from its own). Library (carveout as it launches, the driver's choice) and the
peers table's peer, cold L2, with nothing ("flush": timing.time_cold's order, the flush's
reduction right before) or a one-block kernel at carveout 0 or 100 between the flush and
the start event; five interleaved rounds of each. bf16, 256 rows, seed 20261205; writes
transition_peers.json under --out (default $OUT)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import peers  # noqa: E402
from cupykern import bfloat16, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SEED = 20261205
specs = all_specs()
stream = cupy.cuda.Stream(non_blocking=True)
prev = cupy.RawKernel(r'extern "C" __global__ void prev_kernel() {}', "prev_kernel")
compiled = peers._torch_compile(torch)
liger = peers._liger(torch)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}


def cold(fn, before, repeat=50):
    """timing.time_cold's loop; ``before`` None, or the carveout of a one-block kernel
    launched between the flush and the start event."""
    flusher = timing._L2Flusher()
    if before is not None:
        prev.preferred_shared_memory_carveout = before
    for _ in range(5):
        fn()
    stream.synchronize()
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
    timing.hold_gpu(0.05, stream)
    for start, end in pairs:
        flusher.flush(stream)
        if before is not None:
            prev((1,), (32,), ())
        start.record(stream)
        fn()
        end.record(stream)
    pairs[-1][1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in pairs]))


with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name, op, peer_name, peer in (
            ("llama-3.1-70b", "rms_norm", "liger", liger["rms_norm"][""]),
            ("llama-3.1-70b", "fused_add_rms_norm", "torch.compile", compiled["fused_add_rms_norm"]["out of place"]),
            ("llama-3.1-8b", "fused_add_rms_norm", "torch.compile", compiled["fused_add_rms_norm"]["out of place"]),
            ("llama-3.1-8b", "rms_norm", "liger", liger["rms_norm"][""])):
        model = models.get(model_name)
        spec = specs[op].for_model(model)
        inputs = spec.make_inputs(np.random.default_rng(SEED), 256, specs[op].size_for_model(model), bfloat16)
        fns = {"cupykern": lambda s=spec, i=inputs: s.run(i),
               peer_name: peers._prepare(torch, peer, peers._copy_inputs(inputs))}
        for f in fns.values():
            f()
            f()
        stream.synchronize()
        us = {}
        for rnd in range(5):
            for before in (None, 0, 100):
                for name in (list(fns) if rnd % 2 == 0 else list(fns)[::-1]):
                    us.setdefault(f"{name} after {'flush' if before is None else f'carveout {before}'}",
                                  []).append(cold(fns[name], before))
        results["points"].append({"model": model_name, "op": op, "num_tokens": 256, "us": us})
        print(f"{model_name} {op} 256:", flush=True)
        for key, v in us.items():
            print(f"   {key}: {' '.join(f'{x:.2f}' for x in v)} (median {np.median(v):.2f})", flush=True)
        del inputs, fns
json.dump(results, open(os.path.join(OUT, "transition_peers.json"), "w"), indent=1)
