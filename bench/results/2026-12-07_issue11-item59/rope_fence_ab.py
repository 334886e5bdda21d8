"""NOTES item 59: the token kernels' q/k loads before or behind the position's load.

Before item 59, ptxas sank apply_rope's and qk_rms_norm_rope's token kernels' q/k loads
below their out-of-range return (dead on that path), so each block issued them only once
its position had arrived: a memory round trip before its first q/k byte. Since item 59
the kernels write an out-of-range token's values back, so the loads are used on both
paths and issued first (tests/test_rope_layouts.py reads it in the SASS). For each planned
call that takes a token kernel: "new" (the tree's launch as planned), "old" (the same
launch, the kernel compiled from item59_sources.before_fence()), and for apply_rope from
256 tokens Liger on rows gathered before the call. Bits of new and old compared. bf16, in
place, random positions into the preset's whole cache; 1-64 tokens by CUDA-graph replay,
from 256 cold L2; medians of three interleaved rounds.

    python rope_fence_ab.py [--models llama-3.1-8b,llama-3.1-70b] [--sizes 1,16,...] [--tag T] [--out DIR]

Writes rope_fence_ab_<tag>.json (seed, device, commit, per point: op, model, tokens,
template, instantiation, grid, block, registers and blocks an SM of new and old, bits
equal, microseconds per round)."""
import json
import os
import sys
from pathlib import Path

import cupy
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cupykern  # noqa: E402
import item59_sources  # noqa: E402
from bench import variants  # noqa: E402
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops.rope import APPLY_ROPE_TOKEN, QK_RMS_NORM_ROPE_TOKEN  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402

OUT, TAG = variants.option("--out", os.environ.get("OUT", ".")), variants.option("--tag", "run")
MODELS = variants.option("--models", "llama-3.1-8b,llama-3.1-70b").split(",")
SIZES = tuple(int(n) for n in variants.option("--sizes", "1,16,64,256,528,1024,1584,2300,3036,3900,4096,16384").split(","))
DECODE_MAX_TOKENS = 64  # up to here CUDA-graph replay, past it cold L2 (README's method)
OLD_SOURCE = item59_sources.before_fence()


def planned_call(op, i):
    """The op's call on inputs ``i`` (_rope_inputs), positions unchecked."""
    if op == "apply_rope":
        return lambda: cupykern.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False)
    return lambda: cupykern.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                             i["cos_sin_cache"], eps=i["eps"], check_positions=False)


seed = 20261210
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "commit": os.environ.get("CUPYKERN_COMMIT", "?"), "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        for op in ("apply_rope", "qk_rms_norm_rope"):
            for n in SIZES:
                i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model,
                                 with_weights=op == "qk_rms_norm_rope")
                q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
                q0, k0 = q.copy(), k.copy()
                with launcher.recording() as launched:
                    planned_call(op, i)()
                r = launched[-1]
                if r.template not in (APPLY_ROPE_TOKEN, QK_RMS_NORM_ROPE_TOKEN):
                    print(f"{model_name} {op} {n}: {r.template.name} planned, not a token kernel", flush=True)
                    continue
                instantiation = variants.template_args(r.kernel)
                old = item59_sources.kernel(OLD_SOURCE, r.template, instantiation)
                fns = {"new": lambda: r.kernel(r.grid, r.block, r.args), "old": lambda: old(r.grid, r.block, r.args)}
                outs = variants.outputs_from(fns, (q, k), (q0, k0))
                bitwise = variants.same_bits(outs["new"], outs["old"])
                if op == "apply_rope" and n > DECODE_MAX_TOKENS:
                    fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]),
                                                              model.head_dim)
                timer = timing.time_graph if n <= DECODE_MAX_TOKENS else (lambda f: timing.time_cold(f, repeat=30))
                med = variants.time_rounds(fns, timer)
                point = {"op": op, "model": model_name, "num_tokens": n, "template": r.template.name,
                         "instantiation": [str(a) for a in instantiation], "grid": r.grid, "block": r.block,
                         "registers": {"new": r.kernel.num_regs, "old": old.num_regs},
                         "blocks_per_sm": {"new": jit.blocks_per_sm(r.kernel, r.block[0]),
                                           "old": jit.blocks_per_sm(old, r.block[0])},
                         "timer": "graph replay" if n <= DECODE_MAX_TOKENS else "cold L2",
                         "bitwise": bitwise, "us": med}
                results["points"].append(point)
                rel = 100 * (np.median(med["new"]) / np.median(med["old"]) - 1)
                print(f"{model_name} {op} {n}: {r.template.name} {instantiation[-2:]} blk {r.block[0]} "
                      f"r{r.kernel.num_regs}/{old.num_regs} {point['blocks_per_sm']}; bitwise {bitwise}; "
                      f"new vs old {rel:+.1f} %", flush=True)
                print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
                del i, q, k, q0, k0, outs, fns
json.dump(results, open(os.path.join(OUT, f"rope_fence_ab_{TAG}.json"), "w"), indent=1)
