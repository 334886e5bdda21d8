"""NOTES item 61: rms_norm's layout (or --op's: layer_norm, softmax) from 512 to 4096
rows, against Liger (H100 peers at abf7bc0: llama-3.1-8b at 1024 rows 0.94 of Liger, 9.15
against 8.56 us; 0.94 in 19e82fb's H100 run too, 0.98 on the H200).

The plan takes the decode layout (2 leaves a thread: 8b 256 threads a row, 70b 512) while
the rows' threads fill at most half the GPU's resident threads (8b to 528 rows on 132 SMs),
then the prefill layout (8b 128 x 4, 70b 128 x 8), and rereads its rows from L2 in
reread_layout from 8192 rows (plans.REREAD). Item 28 timed 8b at 1024 rows rereading in
256 x 2 8 % faster than the plan (one point; 70b 3-8 % slower). Variants, each through
the public op under cupykern.plans' constants (bench/variants.plan_constants):
  lib     the plan;
  decode  DECODE_FILL_SHARE_DEFAULT = inf: the decode layout at every size;
  share4  DECODE_FILL_SHARE[op] = 4: the decode layout while the rows' threads
          fill at most 4 times the GPU's resident threads (8b to 4224 rows, 70b to 2112);
  reread  REREAD = {"rms_norm": (1, 4096, 8192)}: the reread layout at every size;
  unfilled  on branch rms-decode-layout-filled only: DECODE_FILL_SHARE_FILLED = {}, main's
          plan (lib there is the branch's);
  liger   the peers table's Liger (casting mode "gemma").
reread and liger for rms_norm only.
--dtypes (default bf16), weights and eps of the presets, cold L2 (timing.time_cold, 50
calls), medians of --rounds interleaved rounds (default 3); bits of the variants against lib. With
--no-liger Liger is neither run nor timed (item 61's first runs: after Liger's timing the
layouts holding their rows read 5-10 % slower for the next two timings, the reread one
not). Seed 20261207.

    python rms_rows_probe.py [--op rms_norm] [--models llama-3.1-8b,llama-3.1-70b] [--sizes 512,...]
                             [--dtypes bf16,fp32] [--rounds 3] [--no-liger] [--tag T] [--out DIR]
"""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from bench import variants  # noqa: E402
from cupykern import _dtypes, launcher, models, plans, timing  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
MODELS = variants.option("--models", "llama-3.1-8b,llama-3.1-70b").split(",")
SIZES = tuple(int(n) for n in variants.option("--sizes", "512,768,1024,1536,2048,3072,4096").split(","))
ROUNDS = int(variants.option("--rounds", "3"))
WITH_LIGER = "--no-liger" not in sys.argv
SEED = 20261207
DTYPES = variants.option("--dtypes", "bf16").split(",")
OP = variants.option("--op", "rms_norm")
VARIANTS = {"lib": {}, "decode": {"DECODE_FILL_SHARE_DEFAULT": float("inf")},
            "share4": {"DECODE_FILL_SHARE": {**plans.DECODE_FILL_SHARE, OP: 4.0}}}
if hasattr(plans, "DECODE_FILL_SHARE_FILLED"):  # branch rms-decode-layout-filled: lib is its plan
    VARIANTS["unfilled"] = {"DECODE_FILL_SHARE_FILLED": {}}  # main's plan
if OP == "rms_norm":  # the one op with a reread pass (plans.REREAD_OPS), and Liger's peer
    VARIANTS["reread"] = {"REREAD": {"rms_norm": (1, 4096, 8192)}}
else:
    WITH_LIGER = False

spec_of = all_specs()[OP]
stream = cupy.cuda.Stream(non_blocking=True)
results = {"op": OP, "seed": SEED, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "rounds": ROUNDS, "liger": WITH_LIGER,
           "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        spec, size = spec_of.for_model(model), spec_of.size_for_model(model)
        for dtype_name, n in ((d, n) for d in DTYPES for n in SIZES):
            inputs = spec.make_inputs(np.random.default_rng(SEED), n, size, _dtypes.parse(dtype_name))
            fns, outs, layouts = {}, {}, {}
            for name, values in VARIANTS.items():
                fns[name] = variants.under(values, lambda s=spec, i=inputs: s.run(i))
                with variants.plan_constants(values), launcher.recording() as launched:
                    outs[name] = tuple(o.copy() for o in spec.run(inputs))
                r = launched[-1]
                layouts[name] = {"kernel": r.template.name, "args": [str(a) for a in variants.template_args(r.kernel)],
                                 "grid": r.grid, "block": r.block, "registers": r.kernel.num_regs}
            if WITH_LIGER:
                fns["liger"] = variants.peer_call("rms_norm", "liger", "", inputs)
                for _ in range(2):  # Triton's first call compiles
                    fns["liger"]()
            stream.synchronize()
            bits = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=50), rounds=ROUNDS)
            results["points"].append({"model": model_name, "dtype": dtype_name, "num_tokens": n, "hidden_size": size,
                                      "layouts": layouts, "bitwise_vs_lib": bits, "us": med})
            lib = np.median(med["lib"])
            print(f"{model_name} {OP} {dtype_name} {n}: " + "; ".join(
                f"{v} {layouts[v]['args'][-4:]} g{layouts[v]['grid']} b{layouts[v]['block']} r{layouts[v]['registers']}"
                for v in layouts) + f"; bits {bits}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)} ({100 * (np.median(v) / lib - 1):+.1f} %)"
                                    for f, v in med.items()), flush=True)
            del inputs, fns, outs
json.dump(results, open(os.path.join(OUT, f"rms_rows_probe_{TAG}.json"), "w"), indent=1)
