"""qk_rms_norm_rope's wide kernel in blocks of fewer tokens (NOTES item 34).

Call A2: apply_rope's wide kernel in blocks of one token (64 threads for llama-3.1-8b, 128
for 70b), a block per token, was 2.9 / 3.8 % faster than the library's filled blocks at
16384 tokens. qk_rms_norm_rope launches 8b in 256-thread blocks of 4 tokens (5 heads a
thread) and 70b in 192-thread blocks of one (3 heads), both in 2 waves of their occupancy.
Each library call (bf16, fp32 cache, int64 positions) is recorded, then the library's kernel
relaunched with T tokens a block (1, 2, 4) and grids of a block per token group ("b") or W
waves of its occupancy ("w1", "w2", "w3"). Two passes (the second in reverse order), cold
L2, copy in the same run; bits against the library call.
"""
import json
import os

os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp
import ml_dtypes
import numpy as np

import cupykern
from cupykern import launcher
from cupykern.registry.rope import _host_cache
from cupykern.timing import copy_bandwidth, time_cold

SEED = 20261204
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "points": []}
print(f"copy {res['copy_gbps']:.0f} GB/s", flush=True)
cache = cp.asarray(_host_cache(128))
qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
    for n in [int(x) for x in os.environ.get("SIZES", "1024,2048,4096,8192,16384").split(",")]:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 128 * 4 + n * 8
        q, k = q0.copy(), k0.copy()
        with launcher.recording() as rec:
            cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
        (L,) = rec
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        p = L.plan
        assert tuple(int(a) for a in L.args[-2:]) == (p.head_slots, p.tokens_per_block), L.args
        variants = {"lib": (L.grid[0], L.block[0], L.args)}
        for tpb in (1, 2, 4):
            active = p.head_slots * p.threads_per_head * tpb
            if active > 256:
                continue
            block = -(-active // 32) * 32
            occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(L.function.ptr, block, 0)
            args = (*L.args[:-1], np.int32(tpb))
            blocks = -(-n // tpb)
            seen = set()
            for gname, grid in {"b": blocks, "w1": min(blocks, occ * SMS), "w2": min(blocks, 2 * occ * SMS),
                                "w3": min(blocks, 3 * occ * SMS)}.items():
                if grid not in seen:
                    seen.add(grid)
                    variants[f"T{tpb} {gname}"] = (grid, block, args)
        print(model, n, "lib plan", p, flush=True)
        times, oks = {v: [] for v in variants}, {}
        for rep in (0, 1):
            for name in (list(variants) if rep == 0 else list(variants)[::-1]):
                grid, block, args = variants[name]
                args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in args)
                if rep == 0:
                    qc, kc = q0.copy(), k0.copy()
                    L.function((grid, 1, 1), (block, 1, 1), args_of(qc, kc), 0)
                    oks[name] = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
                times[name].append(time_cold(lambda: L.function((grid, 1, 1), (block, 1, 1), args_of(q, k), 0),
                                             repeat=30).median_us)
        for name, (grid, block, args) in variants.items():
            us = times[name]
            pct = [nbytes / (u * 1e-6) / 1e9 / res["copy_gbps"] * 100 for u in us]
            res["points"].append({"model": model, "num_tokens": n, "variant": name, "grid": grid, "block": block,
                                  "us": us, "pct_copy": pct, "bitwise_ok": oks[name]})
            print(f"{model:4s} n={n:5d} {name:6s} grid {grid:5d} block {block:3d} {us[0]:8.2f} {us[1]:8.2f} us "
                  f"{pct[0]:5.1f} {pct[1]:5.1f} % bits {'equal' if oks[name] else 'DIFFER'}", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "qk_tokens.json"), "w") as fh:
    json.dump(res, fh, indent=1)
