"""NOTES item 42, call 5: apply_rope 8b at 1024-16384 tokens in Liger's thread shape and
without the wide kernel's loop and guards, bare launches of the library's kernels with
the library's recorded arguments (bf16, in place, cold L2, three interleaved rounds, one
stream for CuPy and torch; bits against the library's):
  lib       the plan: apply_rope_wide_kernel, 5 heads a thread, 8 slots (64 threads a token);
  wide3x16  apply_rope_wide_kernel<..., 3 heads>, 16 slots: 128 threads a token, 2.5 heads
            a thread on average (slots 8-15 skip their third head), Liger's program shape;
  token5    apply_rope_token_kernel<..., 8 lanes, 5 heads> (no token loop, no guards;
            the plan's kernel at decode sizes), 64 threads a token;
  liger     LigerRopeFunction on fp32 cos/sin gathered before (bench/peers.py's form).
Seeded (numpy 20261205)."""
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
LEAD = ("__nv_bfloat16", "float", "long long", True, 8)
seed = 20261205
rng = np.random.default_rng(seed)
stream = cupy.cuda.Stream(non_blocking=True)
results = {"seed": seed, "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "points": []}
wide3 = jit.get_kernel(rope_ops.APPLY_ROPE_WIDE, *LEAD, 0, 3, True)
token5 = jit.get_kernel(rope_ops.APPLY_ROPE_TOKEN, *LEAD, 8, 5)
with stream, torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
    model = models.get("llama-3.1-8b")
    for n in (1024, 4096, 16384):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, model=model)
        q, k, positions, cache = i["q"], i["k"], i["positions"], i["cos_sin_cache"]
        q0, k0 = q.copy(), k.copy()
        with launcher.recording() as launched:
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
        lib = launched[-1]
        assert lib.template is rope_ops.APPLY_ROPE_WIDE and lib.plan.heads_per_thread == 5, lib
        assert int(lib.args[22]) == 8 and int(lib.args[23]) == 8 and int(lib.args[24]) == 1, lib.args[20:26]
        args16 = (*lib.args[:23], np.int32(16), *lib.args[24:])
        rows = cupy.ascontiguousarray(cache[positions])
        half = rows.shape[1] // 2
        cos_t = torch.from_dlpack(cupy.concatenate([rows[:, :half]] * 2, axis=1)[None])
        sin_t = torch.from_dlpack(cupy.concatenate([rows[:, half:]] * 2, axis=1)[None])
        qt, kt = torch.from_dlpack(q), torch.from_dlpack(k)

        def liger(qt=qt, kt=kt, cos_t=cos_t, sin_t=sin_t, n=n):
            LigerRopeFunction.apply(qt.view(1, n, -1, 128).transpose(1, 2), kt.view(1, n, -1, 128).transpose(1, 2),
                                    cos_t, sin_t)

        fns = {"lib": lambda r=lib: r.kernel(r.grid, r.block, r.args),
               "wide3x16": lambda a=args16, n=n: wide3((n,), (128,), a),
               "token5": lambda r=lib, n=n: token5((n,), (64,), r.args),
               "liger": liger}
        outs = {}
        for name in ("lib", "wide3x16", "token5"):
            q[...], k[...] = q0, k0
            fns[name]()
            outs[name] = (q.copy(), k.copy())
        bitwise = {name: variants.same_bits(outs[name], outs["lib"]) for name in outs}
        med = variants.time_rounds(fns, lambda f: timing.time_cold(f, repeat=30))
        regs = {"lib": lib.kernel.num_regs, "wide3x16": wide3.num_regs, "token5": token5.num_regs}
        results["points"].append({"model": "llama-3.1-8b", "num_tokens": n, "registers": regs,
                                  "bitwise": bitwise, "us": med})
        print(f"llama-3.1-8b {n}: regs {regs} bitwise {bitwise}", flush=True)
        print("   " + "; ".join(f"{f} {' '.join(f'{x:.2f}' for x in v)}" for f, v in med.items()), flush=True)
        del i, q, k, q0, k0, outs, fns, rows, cos_t, sin_t, qt, kt
json.dump(results, open(os.path.join(OUT, "rope_shape.json"), "w"), indent=1)
