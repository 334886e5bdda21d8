"""qk_rms_norm_rope's wide kernel of this tree (weights loaded beside the stores, 32-bit
sizes, kHasPass at compile time; NOTES item 32) against bb81c7e's (qk_prev_wide_bb81c7e.cuh:
weights hoisted into a 64-byte stack frame, 64-bit sizes, pass-through branches always).

bf16, fp32 cos/sin cache, int64 positions, llama-3.1-8b (32 + 8 heads) and -70b (64 + 8)
at head_dim = rotary_dim = 128, and 8b's heads with rotary_dim 64 (pass-through dims).
Both kernels launched directly with the library's plan for the shape ("prev", "new"), each
twice in the order prev, new, prev, new; "lib" is the library call (cupykern.qk_rms_norm_rope).
1-64 tokens: graph replay; 256-16384: cold L2 (copy measured in the same run). Bits: every
launch's output against the library's.
"""
import json
import os

os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp
import ml_dtypes
import numpy as np

import cupykern
from cupykern import jit, plans
from cupykern.registry.rope import _host_cache
from cupykern.timing import copy_bandwidth, time_cold, time_graph

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = jit.source("rope.cu") + open(os.path.join(HERE, "qk_prev_wide_bb81c7e.cuh")).read()
LEAD = "__nv_bfloat16, float, long long, true, 8, 8"
HEADS = (2, 3, 4)
NAMES = ([f"qk_prev_wide_kernel<{LEAD}, {h}>" for h in HEADS]
         + [f"qk_rms_norm_rope_wide_kernel<{LEAD}, {h}, {p}>" for h in HEADS for p in ("true", "false")])
mod = cp.RawModule(code=SRC, options=jit.COMPILE_OPTIONS, name_expressions=NAMES)
SEED = 20261203
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "kernels": {}, "points": []}
print(f"copy {res['copy_gbps']:.0f} GB/s", flush=True)
for nm in NAMES:
    f = mod.get_function(nm)
    res["kernels"][nm] = {"regs": f.num_regs, "local": f.local_size_bytes}
    print(nm, f.num_regs, "regs", f.local_size_bytes, "local bytes", flush=True)
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SIZES = [int(x) for x in os.environ.get("SIZES", "1,16,64,256,1024,4096,16384").split(",")]
for model, nq, nk, rotary_dim in (("8b", 32, 8, 128), ("70b", 64, 8, 128), ("8b-rot64", 32, 8, 64)):
    cache = cp.asarray(_host_cache(rotary_dim))
    qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    for n in SIZES:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * rotary_dim * 4 + n * 8
        q, k = q0.copy(), k0.copy()
        cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        plan = plans.plan_rope(n, nq + nk, 128, rotary_dim, q0.dtype, max_vec_width=8, fused_norm=True,
                               limits=plans.DeviceLimits.of_device(0))
        sizes = (n, nq, nk, 128, rotary_dim, cache.shape[0], 1, nq * 128, 128, nk * 128, 128, rotary_dim)
        tail = (np.float32(EPS), np.int32(plan.head_slots), np.int32(plan.tokens_per_block))
        has_pass = "true" if rotary_dim < 128 else "false"
        kernels = {
            "prev": (mod.get_function(f"qk_prev_wide_kernel<{LEAD}, {plan.heads_per_thread}>"),
                     (pos, cache, *map(np.int64, sizes), *tail)),
            "new": (mod.get_function(f"qk_rms_norm_rope_wide_kernel<{LEAD}, {plan.heads_per_thread}, {has_pass}>"),
                    (pos, cache, *map(np.int32, sizes), *tail)),
        }

        def record(name, fn, ok):
            t, kind = (time_graph(fn), "graph") if n <= 64 else (time_cold(fn, repeat=30), "cold")
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / res["copy_gbps"] * 100
            res["points"].append({"model": model, "num_tokens": n, "kernel": name, "heads": plan.heads_per_thread,
                                  "us": t.median_us, "timing": kind, "pct_copy": pct, "bitwise_ok": ok})
            print(f"{model:8s} n={n:5d} {name:6s} H{plan.heads_per_thread} {t.median_us:8.2f} us {pct:5.1f} % "
                  f"bits {'equal' if ok else 'DIFFER'}", flush=True)

        for name in ("prev", "new", "prev", "new"):
            f, args = kernels[name]
            qc, kc = q0.copy(), k0.copy()
            f(plan.grid, plan.block, (qc, kc, qw, kw, *args))
            ok = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
            record(name, lambda: f(plan.grid, plan.block, (q, k, qw, kw, *args)), ok)
        record("lib", lambda: cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False), True)
with open(os.path.join(os.environ.get("OUT", "."), "qk_prev.json"), "w") as fh:
    json.dump(res, fh, indent=1)
