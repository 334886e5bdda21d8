"""apply_rope's wide kernel in other blocks and grids (NOTES item 34).

At 4096 tokens apply_rope reaches 84.6 % (llama-3.1-8b) and 85.9 % (70b) of the copy where
Liger's kernel (one 128-thread program a token, every head) reaches about 90.5 and 96.8 % by
the same byte count (peers run of a349b3e). The library launches 256-thread blocks of 4 (8b)
or 2 (70b) tokens, 5 heads a thread, a block per token group (2 an SM by its launch bounds).
Here each library call (bf16, fp32 cos/sin cache, int64 positions, in place) is recorded and
the library's wide kernel relaunched with H heads a thread (3, 4, 5), T tokens a block (1, 2,
4, 8: blocks of 64-256 threads) and grids of a block per token group ("b") or W waves of the
kernel's occupancy ("w1", "w2"). Each variant is timed twice (the second pass in reverse
order), cold L2, copy in the same run; bits of every variant against the library call's.
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
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "sms": SMS, "points": [], "kernels": {}}
print(f"copy {res['copy_gbps']:.0f} GB/s, {SMS} SMs", flush=True)
SIZES = [int(x) for x in os.environ.get("SIZES", "1024,2048,4096,8192,16384").split(",")]
HEADS = [int(x) for x in os.environ.get("HEADS", "3,4,5").split(",")]
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
    nh = nq + nk
    cache = cp.asarray(_host_cache(128))
    for n in SIZES:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 128 * 4 + n * 8
        q, k = q0.copy(), k0.copy()
        with launcher.recording() as rec:
            cupykern.apply_rope(q, k, pos, cache, check_positions=False)
        (L,) = rec
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        p = L.plan
        # apply_rope_wide_kernel's threads_per_head, head_slots, tokens_per_block
        assert tuple(int(a) for a in L.args[22:25]) == (p.threads_per_head, p.head_slots, p.tokens_per_block), L.args
        variants = {"lib": (L.function, L.grid[0], L.block[0], L.args)}
        for h in HEADS:
            f = jit.get_kernel(rope_ops.APPLY_ROPE_WIDE, "__nv_bfloat16", "float", "long long", True, 8, 0, h, True)
            slots = -(-nh // h)
            for tpb in (1, 2, 4, 8):
                active = slots * p.threads_per_head * tpb
                if active > 256:
                    continue
                block = -(-active // 32) * 32
                occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, block, 0)
                res["kernels"][f"H{h} {model} T{tpb}"] = {"regs": f.num_regs, "local": f.local_size_bytes,
                                                          "block": block, "occupancy": occ}
                args = (*L.args[:23], np.int32(slots), np.int32(tpb), *L.args[25:])
                blocks = -(-n // tpb)
                grids = {"b": blocks, "w1": min(blocks, occ * SMS), "w2": min(blocks, 2 * occ * SMS)}
                seen = set()
                for gname, grid in grids.items():
                    if grid in seen:
                        continue
                    seen.add(grid)
                    variants[f"H{h} T{tpb} {gname}"] = (f.kernel, grid, block, args)
        print(model, n, "lib plan", p, flush=True)
        times = {name: [] for name in variants}
        oks = {}
        for rep in (0, 1):
            for name in (list(variants) if rep == 0 else list(variants)[::-1]):
                fn, grid, block, args = variants[name]
                args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in args)
                if rep == 0:
                    qc, kc = q0.copy(), k0.copy()
                    fn((grid, 1, 1), (block, 1, 1), args_of(qc, kc), 0)
                    oks[name] = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
                t = time_cold(lambda: fn((grid, 1, 1), (block, 1, 1), args_of(q, k), 0), repeat=30)
                times[name].append(t.median_us)
        for name, (fn, grid, block, args) in variants.items():
            us = times[name]
            pct = [nbytes / (u * 1e-6) / 1e9 / res["copy_gbps"] * 100 for u in us]
            res["points"].append({"model": model, "num_tokens": n, "variant": name, "grid": grid, "block": block,
                                  "us": us, "pct_copy": pct, "bitwise_ok": oks[name]})
            print(f"{model:4s} n={n:5d} {name:12s} grid {grid:5d} block {block:3d} {us[0]:8.2f} {us[1]:8.2f} us "
                  f"{pct[0]:5.1f} {pct[1]:5.1f} % bits {'equal' if oks[name] else 'DIFFER'}", flush=True)
print(json.dumps(res["kernels"]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "rope_layouts.json"), "w") as fh:
    json.dump(res, fh, indent=1)
