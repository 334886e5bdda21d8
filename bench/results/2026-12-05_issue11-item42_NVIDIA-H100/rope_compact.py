"""NOTES item 42, call 4: apply_rope's wide kernel with each warp's heads next to one
another. The library gives slot s of a token heads s, s + head_slots, s + 2 head_slots,
...: with 4 slots a warp (8 lanes a head), warp 0 of llama-3.1-8b's 64-thread token holds
heads 0-3, 8-11, 16-19, 24-27, 32-35, so its loads span the whole 10 KB of the token and it
can start computing only when nearly all of the token has arrived. Liger's warps each read
a compact part of the token. Variant `compact`: warp w holds heads 20w .. 20w + 19 (heads
w * 4 * kHeads + j * 4 + s for its slot s of 4 and j < kHeads); each load instruction still
reads 4 consecutive heads. The same per-element expressions, so the bits are the
library's. 70b's 120 threads a token (15 slots) leave the last warp part-filled: there
`compact` runs with 16 slots (128 threads, heads past 71 skipped by the kernel's guard),
beside `lib16` (the library's kernel with 16 slots) to tell the mapping from the slot count.
Cold L2, bf16, in place, three interleaved rounds, one stream for CuPy and torch; Liger
with fp32 cos/sin gathered before (bench/peers.py's form). Seeded (numpy 20261205)."""
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
from cupykern import jit, launcher, models, timing  # noqa: E402
from cupykern.ops import rope as rope_ops  # noqa: E402
from cupykern.registry.rope import _rope_inputs  # noqa: E402
from liger_kernel.ops.rope import LigerRopeFunction  # noqa: E402

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
SRC = jit.source("rope.cu")
start = SRC.index("apply_rope_wide_kernel(", SRC.index("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks"))
end = SRC.index("apply_rope, token kernel")
OLD = "const int h = th.slot + j * head_slots;"
NEW = ("const int spw = 32 / threads_per_head; "
       "const int h = (th.slot / spw) * spw * kMaxHeads + j * spw + th.slot % spw;")
assert SRC[start:end].count(OLD) == 2
COMPACT_SRC = SRC[:start] + SRC[start:end].replace(OLD, NEW) + SRC[end:]


def compact_kernel(expr, _built={}):
    if expr not in _built:
        _built[expr] = cupy.RawModule(code=COMPACT_SRC, options=jit.COMPILE_OPTIONS,
                                      name_expressions=[expr]).get_function(expr)
    return _built[expr]


seed = 20261205
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    for model_name in ("llama-3.1-8b", "llama-3.1-70b"):
        model = models.get(model_name)
        for n in (1024, 4096, 16384):
            i = _rope_inputs(rng, n, 128, cupykern.bfloat16, model=model)
            q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
            q0, k0 = q.copy(), k.copy()
            with launcher.recording() as launched:
                cupykern.apply_rope(q, k, positions, cache, check_positions=False)
            lib = launched[-1]
            assert lib.template is rope_ops.APPLY_ROPE_WIDE, lib
            plan = lib.plan
            assert int(lib.args[22]) == plan.threads_per_head and int(lib.args[23]) == plan.head_slots, lib.args[20:26]
            heads = plan.heads_per_thread
            slots = -(-plan.head_slots * plan.threads_per_head // 32) * 32 // plan.threads_per_head  # whole warps
            assert slots * plan.threads_per_head == lib.block[0], (slots, lib.block)
            args16 = (*lib.args[:23], np.int32(slots), *lib.args[24:])
            expr = rope_ops.APPLY_ROPE_WIDE.expr("__nv_bfloat16", "float", "long long", True, 8, 0, heads, True)
            compact = compact_kernel(expr)
            rows = cupy.ascontiguousarray(cache[positions])
            half = rows.shape[1] // 2
            cos_t = torch.from_dlpack(cupy.concatenate([rows[:, :half]] * 2, axis=1)[None])
            sin_t = torch.from_dlpack(cupy.concatenate([rows[:, half:]] * 2, axis=1)[None])
            qt, kt = torch.from_dlpack(q), torch.from_dlpack(k)

            def liger(qt=qt, kt=kt, cos_t=cos_t, sin_t=sin_t, n=n):
                LigerRopeFunction.apply(qt.view(1, n, -1, 128).transpose(1, 2), kt.view(1, n, -1, 128).transpose(1, 2),
                                        cos_t, sin_t)

            fns = {"lib": lambda r=lib: r.kernel(r.grid, r.block, r.args),
                   "compact": lambda r=lib, f=compact, a=args16: f(r.grid, r.block, a)}
            if slots != plan.head_slots:
                fns["lib16"] = lambda r=lib, a=args16: r.kernel(r.grid, r.block, a)
            fns["liger"] = liger
            outs = {}
            for name in fns:
                if name == "liger":
                    continue
                q[...], k[...] = q0, k0
                fns[name]()
                outs[name] = (q.copy(), k.copy())
            bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
            med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
            results["points"].append({"model": model_name, "num_tokens": n, "heads_per_thread": heads,
                                      "head_slots": [plan.head_slots, slots], "block": lib.block,
                                      "registers": [lib.kernel.num_regs, compact.num_regs],
                                      "bitwise": bitwise, "us": med})
            print(f"{model_name} {n}: heads {heads} slots {plan.head_slots}/{slots} regs lib/compact "
                  f"{lib.kernel.num_regs}/{compact.num_regs} bitwise {bitwise}", flush=True)
            print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
            del i, q, k, q0, k0, outs, fns, rows, cos_t, sin_t, qt, kt
json.dump(results, open(os.path.join(OUT, "rope_compact.json"), "w"), indent=1)
