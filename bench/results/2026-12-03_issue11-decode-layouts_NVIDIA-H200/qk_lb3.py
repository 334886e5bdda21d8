"""qk_rms_norm_rope's wide kernel for llama-3.1-8b with launch bounds of 3 blocks an SM (NOTES item 34).

The library's 5-heads kernel (8b at prefill: 256-thread blocks of 4 tokens) takes 119-128
registers under `__launch_bounds__(256, 2)`: 2 blocks an SM. Built with 3 (85 registers at
most) ptxas spills 128 bytes at 5 heads and 52 at 4 (CPU, sm_90). Does the third block pay
for the spills? Each library call (bf16, fp32 cache, int64 positions) is recorded; the
variants are the library kernel and rope.cu rebuilt with kQkWideMinBlocksPerSm = 3, at 4 and
5 heads, in 1-3 waves of their own occupancy. Two passes, cold L2, bits against the library.
"""
import json
import os

os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp
import ml_dtypes
import numpy as np

import cupykern
from cupykern import jit, launcher
from cupykern.ops import rope as rope_ops
from cupykern.registry.rope import _host_cache
from cupykern.timing import copy_bandwidth, time_cold

SEED = 20261204
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "points": [], "kernels": {}}
print(f"copy {res['copy_gbps']:.0f} GB/s", flush=True)
SOURCE = jit.source("rope.cu")
OLD = "constexpr int kQkWideMinBlocksPerSm = 2;"
assert OLD in SOURCE


def build(h: int, min_blocks: int):
    expr = rope_ops.QK_RMS_NORM_ROPE_WIDE.expr("__nv_bfloat16", "float", "long long", True, 8, 8, h, False)
    code = SOURCE.replace(OLD, f"constexpr int kQkWideMinBlocksPerSm = {min_blocks};")
    return cp.RawModule(code=code, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)


nq, nk = 32, 8
nh = nq + nk
cache = cp.asarray(_host_cache(128))
qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
kernels = {f"H{h} lb{m}": build(h, m) for h in (4, 5) for m in (2, 3)}
for name, f in kernels.items():
    res["kernels"][name] = {"regs": f.num_regs, "local": f.local_size_bytes}
print(res["kernels"], flush=True)
for n in [int(x) for x in os.environ.get("SIZES", "1024,4096,16384").split(",")]:
    pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
    q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
    k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
    nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 128 * 4 + n * 8
    q, k = q0.copy(), k0.copy()
    with launcher.recording() as rec:
        cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
    (L,) = rec
    want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
    variants = {"lib": (L.function, L.grid[0], L.block[0], L.args)}
    for name, f in kernels.items():
        h = int(name[1])
        slots = -(-nh // h)
        tpb = max(1, 256 // (slots * 8))
        block = -(-slots * 8 * tpb // 32) * 32
        occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, block, 0)
        res["kernels"][name]["occupancy"] = occ
        args = (*L.args[:-2], np.int32(slots), np.int32(tpb))
        for w in (1, 2, 3):
            variants[f"{name} w{w}"] = (f.kernel, min(-(-n // tpb), w * occ * SMS), block, args)
    print(n, "lib plan", L.plan, flush=True)
    times, oks = {k: [] for k in variants}, {}
    for rep in (0, 1):
        for name in (list(variants) if rep == 0 else list(variants)[::-1]):
            fn, grid, block, args = variants[name]
            args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in args)
            if rep == 0:
                qc, kc = q0.copy(), k0.copy()
                fn((grid, 1, 1), (block, 1, 1), args_of(qc, kc), 0)
                oks[name] = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
            times[name].append(time_cold(lambda: fn((grid, 1, 1), (block, 1, 1), args_of(q, k), 0),
                                         repeat=30).median_us)
    for name, (fn, grid, block, args) in variants.items():
        us = times[name]
        pct = [nbytes / (u * 1e-6) / 1e9 / res["copy_gbps"] * 100 for u in us]
        res["points"].append({"num_tokens": n, "variant": name, "grid": grid, "block": block, "us": us,
                              "pct_copy": pct, "bitwise_ok": oks[name]})
        print(f"8b n={n:5d} {name:10s} grid {grid:5d} block {block:3d} {us[0]:8.2f} {us[1]:8.2f} us "
              f"{pct[0]:5.1f} {pct[1]:5.1f} % bits {'equal' if oks[name] else 'DIFFER'}", flush=True)
print(json.dumps(res["kernels"]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "qk_lb3.json"), "w") as fh:
    json.dump(res, fh, indent=1)
