"""NOTES item 46, call 2: the shared-memory carveout of the library's kernels (call 1's
gap_probe.py: the fused add 70b at 256 rows 9.04 us with the driver's default, 8.69 with
the carveout at 100 % shared, 9.85 at 0 %; every form's time followed the carveout the
kernel had when it ran).

Part A: the library's kernel of each point launched bare with its recorded arguments, at
preferred_shared_memory_carveout -1 (the driver's choice, as the library launches today),
100 and 0 (each form sets its value before it is timed), three interleaved rounds:
graph replay (timing.time_graph) at 1-64 tokens, cold L2 (timing.time_cold) from 256.
"empty" rows: a kernel that returns at once, at the grid and block of rms_norm 70b.
Part B: is it the change of configuration between kernels? The fused add 70b at 256 rows
(and the empty kernel), cold L2, with a kernel of one block that returns at once launched
between the flush and the start event at carveout 0 or 100 ("after0"/"after100"), the
timed kernel at -1, 0 or 100.
bf16, seed 20261205; writes carveout_probe.json under --out (default $OUT)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import variants  # noqa: E402
from cupykern import bfloat16, launcher, models, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SEED = 20261205
CARVEOUTS = (-1, 100, 0)
EMPTY_SRC = r'extern "C" __global__ void empty_kernel() {}'
CASES = [(op, m, n) for op in ("rms_norm", "fused_add_rms_norm") for m in ("llama-3.1-8b", "llama-3.1-70b")
         for n in (1, 16, 64, 256, 1024, 4096)]
CASES += [("silu_and_mul", "llama-3.1-8b", n) for n in (1, 64, 256, 4096)]
CASES += [("gelu_and_mul", "llama-3.1-8b", n) for n in (1, 64, 256)]
CASES += [("apply_rope", m, n) for m in ("llama-3.1-8b", "llama-3.1-70b") for n in (1, 64, 1024, 4096)]
CASES += [(op, "llama-3.1-70b", n) for op in ("layer_norm", "softmax") for n in (64, 256)]

specs = all_specs()
results = {"seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": [],
           "transition": []}
stream = cupy.cuda.Stream(non_blocking=True)


def recorded(run, inputs):
    with launcher.recording() as launched:
        run(inputs)
    return launched[-1]


def set_then(kernel, carveout, launch):
    def call():
        kernel.preferred_shared_memory_carveout = carveout
        launch()
    return call


def graph_at(kernel, carveout):
    def timer(fn):
        kernel.preferred_shared_memory_carveout = carveout
        return timing.time_graph(fn)
    return timer


def cold_after(prev, prev_carveout, fn, repeat=50):
    """timing.time_cold with ``prev`` (one block, returns at once) between flush and start."""
    flusher = timing._L2Flusher()
    prev.preferred_shared_memory_carveout = prev_carveout
    for _ in range(5):
        fn()
    stream.synchronize()
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
    timing.hold_gpu(0.05, stream)
    for start, end in pairs:
        flusher.flush(stream)
        prev((1,), (32,), ())
        start.record(stream)
        fn()
        end.record(stream)
    pairs[-1][1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in pairs]))


def fmt(med):
    return "; ".join(f"{f} {' '.join(f'{x:.3f}' for x in v)}" for f, v in med.items())


with stream:
    empty = cupy.RawKernel(EMPTY_SRC, "empty_kernel")
    for kind, grid, block in (("graph", (64,), (512,)), ("cold", (256,), (512,))):
        fns = {f"c{c}": set_then(empty, c, lambda g=grid, b=block: empty(g, b, ())) for c in CARVEOUTS}
        if kind == "graph":
            med = variants.time_rounds({f"c{c}": (lambda g=grid, b=block: empty(g, b, ())) for c in CARVEOUTS},
                                       {f"c{c}": graph_at(empty, c) for c in CARVEOUTS})
        else:
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=50))
        results["points"].append({"op": "empty", "grid": grid, "block": block, "method": kind, "us": med})
        print(f"empty {kind} grid {grid} block {block}: {fmt(med)}", flush=True)

    for op, model_name, n in CASES:
        try:
            model = models.get(model_name)
            spec = specs[op].for_model(model)
            inputs = spec.make_inputs(np.random.default_rng(SEED), n, specs[op].size_for_model(model), bfloat16)
            r = recorded(spec.run, inputs)
            k = r.kernel

            def launch(r=r):
                r.kernel(r.grid, r.block, r.args, shared_mem=r.shared_mem)
            if n <= 64:
                kind = "graph"
                med = variants.time_rounds({f"c{c}": launch for c in CARVEOUTS}, {f"c{c}": graph_at(k, c) for c in CARVEOUTS})
            else:
                kind = "cold"
                med = variants.time_rounds({f"c{c}": set_then(k, c, launch) for c in CARVEOUTS},
                                           lambda f: timing.time_cold(f, repeat=50))
            k.preferred_shared_memory_carveout = -1
            results["points"].append({"op": op, "model": model_name, "num_tokens": n, "grid": r.grid, "block": r.block,
                                      "shared_size_bytes": k.shared_size_bytes, "dynamic_shared": r.shared_mem,
                                      "num_regs": k.num_regs, "method": kind, "us": med})
            print(f"{model_name} {op} {n} ({kind}, grid {r.grid} block {r.block} smem {k.shared_size_bytes}+"
                  f"{r.shared_mem} regs {k.num_regs}): {fmt(med)}", flush=True)
            del inputs
        except Exception as exc:  # noqa: BLE001 - one failing point must not end the probe
            print(f"{model_name} {op} {n}: {exc.__class__.__name__}: {exc}", flush=True)

    prev = cupy.RawKernel(EMPTY_SRC.replace("empty_kernel", "prev_kernel"), "prev_kernel")
    model = models.get("llama-3.1-70b")
    spec = specs["fused_add_rms_norm"].for_model(model)
    inputs = spec.make_inputs(np.random.default_rng(SEED), 256, model.hidden_size, bfloat16)
    r = recorded(spec.run, inputs)
    for name, kernel, launch in (("fused_add 70b 256", r.kernel,
                                  lambda: r.kernel(r.grid, r.block, r.args, shared_mem=r.shared_mem)),
                                 ("empty 256x512", empty, lambda: empty((256,), (512,), ()))):
        rounds = {}
        for rnd in range(3):
            for pc in (0, 100):
                for c in CARVEOUTS:
                    kernel.preferred_shared_memory_carveout = c
                    rounds.setdefault(f"after{pc}_c{c}", []).append(cold_after(prev, pc, launch))
        kernel.preferred_shared_memory_carveout = -1
        results["transition"].append({"kernel": name, "us": rounds})
        print(f"{name}: {fmt(rounds)}", flush=True)
json.dump(results, open(os.path.join(OUT, "carveout_probe.json"), "w"), indent=1)
