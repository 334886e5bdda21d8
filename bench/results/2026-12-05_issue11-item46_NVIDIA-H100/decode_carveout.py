"""NOTES item 46, call 3: does the carveout change between kernels (call 2) cost the
captured decode step? bench/bench_decode_step.py's step (SmolLM2-135M shapes, random
weights, fp16, cache position 136, max_tokens 1024), captured with every kernel of the
step at one preferred_shared_memory_carveout (-1: the driver's choice for each, as the
library launches; then 100, 50, 0 for all), dependent launches on and off. The step's
time by graph replay (one step a graph, and steps_per_graph steps a graph), three
interleaved rounds. Prints each kernel's static and dynamic shared memory. Writes
decode_carveout.json under --out (default $OUT)."""
import json
import os
import sys
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench.bench_decode_step import random_model  # noqa: E402
from cupykern import launcher  # noqa: E402
from cupykern.llm.decode_graph import GraphDecoder  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SEED, POSITION, MAX_TOKENS = 20261205, 136, 1024
CARVEOUTS = (-1, 100, 50, 0)

model = random_model(cupy.float16, SEED)
decoders = {pdl: GraphDecoder(model, MAX_TOKENS, enable_pdl=pdl) for pdl in (None, False)}
with decoders[None].stream:
    decoders[None].step()
    with launcher.recording() as launched:
        decoders[None].step()
    decoders[None].stream.synchronize()
kernels = {}
for launch in launched:
    kernels.setdefault(id(launch.kernel), (launch, []))[1].append(1)
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "position": POSITION,
           "pdl": decoders[None].pdl, "launches": len(launched), "kernels": [], "us": {}}
for launch, times in kernels.values():
    k = launch.kernel
    entry = {"op": launch.op, "launches": len(times), "grid": launch.grid, "block": launch.block,
             "static_shared": k.shared_size_bytes, "dynamic_shared": launch.shared_mem, "regs": k.num_regs}
    results["kernels"].append(entry)
    print(entry, flush=True)
print(f"{len(launched)} launches a step, {len(kernels)} kernels; pdl {decoders[None].pdl}", flush=True)

for rnd in range(3):
    order = CARVEOUTS[rnd % len(CARVEOUTS):] + CARVEOUTS[:rnd % len(CARVEOUTS)]
    for c in order:
        for launch, _ in kernels.values():
            launch.kernel.preferred_shared_memory_carveout = c
        for pdl, decoder in decoders.items():
            decoder.capture()
            key = f"carveout {c}, {'dependent' if decoder.pdl else 'plain'} launches"
            row = results["us"].setdefault(key, {"step": [], "batched": []})
            row["step"].append(decoder.step_time_us(POSITION))
            row["batched"].append(decoder.steps_time_us(POSITION))
for key, row in results["us"].items():
    print(f"{key}: step {' '.join(f'{x:.1f}' for x in row['step'])}; "
          f"batched {' '.join(f'{x:.1f}' for x in row['batched'])} us", flush=True)
json.dump(results, open(os.path.join(OUT, "decode_carveout.json"), "w"), indent=1)
