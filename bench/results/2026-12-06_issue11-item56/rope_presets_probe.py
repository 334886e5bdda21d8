"""NOTES item 56: apply_rope on the presets whose shapes trail Liger (phi-3-mini's 32 + 32
heads of 96: 6 lanes a head, the wide kernel at 5 heads a thread from 528 tokens, 13 slots
of 6 lanes in a 96-thread block; smollm2-135m's 9 + 3 heads of 64: 4 lanes, 3 heads a
thread, 16 threads a token in 64-thread blocks), in place, bf16, cold L2, medians of three
rounds: the plan ("lib") beside the wide kernel planned with other heads a thread
("h2", "h3", "h4", below) and with larger blocks
(ROPE_WIDE_BLOCK_THREADS: "b128", "b256"), and Liger as item 53's script times it. Every
variant's bytes are checked equal to lib's; a variant planned as lib is left out at that shape.

    python rope_presets_probe.py [--models phi-3-mini,smollm2-135m] [--sizes 16,528,...] [--tag T] [--out DIR]

Writes rope_presets_probe_<tag>.json (seed, device, per point: each variant's plan, block,
registers, bits equal to lib, microseconds per round)."""
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
from cupykern import launcher, models, timing  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402


def arg(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


OUT, TAG = arg("--out", os.environ.get("OUT", ".")), arg("--tag", "run")
MODELS = arg("--models", "phi-3-mini,smollm2-135m").split(",")
SIZES = tuple(int(n) for n in arg("--sizes", "16,528,1024,2300,4092,16384").split(","))
# hN: the prefill sizes' fewest heads a thread (ROPE_WIDE_HEADS_PER_THREAD) set to N and the
# choices narrowed to the decode sizes' 2 and N, so the wide kernel takes N from 528 tokens
# (as tests/test_rope_layouts.py's "wide-4-heads" layout); the token kernels' heads kept
# among the choices (neither preset has a token kernel: 6 and 4 lanes a head).
VARIANTS = {"lib": {}, "h2": {"ROPE_WIDE_HEADS_CHOICES": (2,), "ROPE_TOKEN_HEADS": (2,)},
            **{f"h{n}": {"ROPE_WIDE_HEADS_CHOICES": (2, n), "ROPE_WIDE_HEADS_PER_THREAD": n, "ROPE_TOKEN_HEADS": (2,)}
               for n in (3, 4)},
            "b128": {"ROPE_WIDE_BLOCK_THREADS": 128}, "b256": {"ROPE_WIDE_BLOCK_THREADS": 256}}


def record(q, k, positions, cache, constants):
    with variants.plan_constants(constants), launcher.recording() as launched:
        cupykern.apply_rope(q, k, positions, cache, check_positions=False)
    return launched[-1]


seed = 20261206
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           "variants": {k: {n: repr(v) for n, v in c.items()} for k, c in VARIANTS.items()}, "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in MODELS:
        model = models.get(model_name)
        for n in SIZES:
            i = _rope_inputs(rng, n, model.head_dim, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            launches, fns = {}, {}
            for name, constants in VARIANTS.items():
                try:
                    r = record(q, k, positions, cache, constants)
                except ValueError as e:  # a narrowed choice that does not fit this shape
                    print(f"{model_name} {n} {name}: {e}", flush=True)
                    continue
                if name != "lib" and r.plan == launches["lib"].plan:
                    continue  # the same launch as lib's at this shape
                launches[name] = r
                fns[name] = lambda r=r: r.kernel(r.grid, r.block, r.args)
            outs = variants.outputs_from(fns, (q, k), (q0, k0))
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            fns["liger"] = variants.liger_rope_on_rows(q, k, cupy.ascontiguousarray(cache[positions]), model.head_dim)
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            plans_ = {name: {"template": r.template.name, "heads_per_thread": r.plan.heads_per_thread,
                             "tokens_per_block": r.plan.tokens_per_block, "block": r.block, "grid": r.grid,
                             "registers": r.kernel.num_regs} for name, r in launches.items()}
            results["points"].append({"model": model_name, "num_tokens": n, "plans": plans_, "bitwise": bitwise,
                                      "us": med})
            print(f"{model_name} {n}: " + "; ".join(
                f"{name} {p['heads_per_thread']}h {p['tokens_per_block']}t blk {p['block'][0]} r{p['registers']}"
                for name, p in plans_.items()) + f"; bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns, launches
json.dump(results, open(os.path.join(OUT, f"rope_presets_probe_{TAG}.json"), "w"), indent=1)
