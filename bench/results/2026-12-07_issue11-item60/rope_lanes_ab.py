"""NOTES item 60: apply_rope's token kernel at 6 lanes a head (plans.ROPE_TOKEN_6_LANES_HEADS),
against the plan without it.

phi-3-mini's heads of 96 are 6 lanes of 16-byte vectors, so before item 60 its shape never
took the token kernel (compiled for 8, 16 and 32 lanes); its decode layout (2 heads a
thread, 32 slots, 192 threads) fills it. For each point, in the same process: "plan" (the
tree's launch as planned), "lib" (the launch planned with ROPE_TOKEN_6_LANES_HEADS empty,
main's plan before item 60), and from 256 tokens Liger on rows gathered before
the call. Each variant's launch is recorded once and replayed, so planning is not timed.
Bits of plan and lib compared. bf16, in place, random positions into the preset's whole
cache; 1-64 tokens by CUDA-graph replay, from 256 cold L2; medians of three interleaved
rounds.

    python rope_lanes_ab.py [--models phi-3-mini] [--sizes 1,16,...] [--tag T] [--out DIR]

Runs on a tree with plans.ROPE_TOKEN_6_LANES_HEADS (branch rope-token-6-lanes). Call 11 ran
it at 0ab9c36, whose table was ROPE_TOKEN_THREADS_PER_HEAD (6, 8, 16, 32), lib (8, 16, 32):
the same two plans for phi-3-mini (its JSON records the constants).

Writes rope_lanes_ab_<tag>.json (seed, device, commit, per point: each variant's template,
instantiation, grid, block, registers and blocks an SM, bits equal, microseconds per
round)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import cupykern  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, timing  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
MODELS = variants.option("--models", "phi-3-mini").split(",")
SIZES = tuple(int(n) for n in variants.option("--sizes", "1,16,64,256,527").split(","))
DECODE_MAX_TOKENS = 64  # up to here CUDA-graph replay, past it cold L2 (README's method)
CONSTANTS = {"plan": {}, "lib": {"ROPE_TOKEN_6_LANES_HEADS": ()}}


def recorded_launch(i, constants):
    """apply_rope on inputs ``i`` planned under ``constants``: its launcher record."""
    with variants.plan_constants(constants), launcher.recording() as launched:
        cupykern.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False)
    return launched[-1]


def replay(r):
    return lambda: r.kernel(r.grid, r.block, r.args)


seed = 20261211
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
constants = {variant: {name: list(value) for name, value in c.items()} for variant, c in CONSTANTS.items()}
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "constants": constants, "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model, n, i, start in variants.rope_points(rng, MODELS, SIZES):
        records = {name: recorded_launch(i, c) for name, c in CONSTANTS.items()}
        fns = {name: replay(r) for name, r in records.items()}
        outs = variants.outputs_from(fns, (i["q"], i["k"]), start)
        bitwise = variants.same_bits(outs["plan"], outs["lib"])
        if n > DECODE_MAX_TOKENS:
            rows = cupy.ascontiguousarray(i["cos_sin_cache"][i["positions"]])
            fns["liger"] = variants.liger_rope_on_rows(i["q"], i["k"], rows, model.head_dim)
        timer = timing.time_graph if n <= DECODE_MAX_TOKENS else (lambda f: timing.time_cold(f, repeat=30))
        med = variants.time_rounds(fns, timer)
        launches = {name: {"template": r.template.name,
                           "instantiation": [str(a) for a in variants.template_args(r.kernel)],
                           "grid": r.grid, "block": r.block, "registers": r.kernel.num_regs,
                           "blocks_per_sm": jit.blocks_per_sm(r.kernel, r.block[0])}
                    for name, r in records.items()}
        results["points"].append({"model": model.name, "num_tokens": n, "launches": launches,
                                  "timer": "graph replay" if n <= DECODE_MAX_TOKENS else "cold L2",
                                  "bitwise": bitwise, "us": med})
        rel = 100 * (np.median(med["plan"]) / np.median(med["lib"]) - 1)
        shown = "; ".join(f"{name} {v['template']} {v['instantiation'][-2:]} blk {v['block'][0]} "
                          f"r{v['registers']} {v['blocks_per_sm']}/SM" for name, v in launches.items())
        print(f"{model.name} {n}: {shown}; bitwise {bitwise}; plan vs lib {rel:+.1f} %", flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, start, outs, fns, records
json.dump(results, open(os.path.join(OUT, f"rope_lanes_ab_{TAG}.json"), "w"), indent=1)
