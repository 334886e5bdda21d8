"""The wide RoPE kernels' grid against the blocks an SM really holds (NOTES item 33).

plan_rope caps qk_rms_norm_rope's grid at ROPE_WIDE_NORM_GRID_WAVES (2) x
ROPE_WIDE_BLOCKS_PER_SM (2) x SMs = 528 blocks on an H200, whatever the kernel's
registers allow: llama-3.1-70b's 192-thread blocks of the 3-heads kernel (96 registers)
fit 3 an SM, so 396 run and 132 follow alone. apply_rope launches a block per token group.
Here each library call (bf16, fp32 cos/sin cache, int64 positions, in place) is recorded
and its kernel relaunched with other grids: "lib" (the plan's), "blocks" (a block per
token group), and "wN" = min(blocks, N x occupancy x SMs), occupancy from the CUDA
occupancy API for the kernel and block. Cold L2, copy in the same run; bits of every
launch against the library call's.
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

SEED = 20261203
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "sms": SMS, "points": []}
print(f"copy {res['copy_gbps']:.0f} GB/s, {SMS} SMs", flush=True)
SIZES = [int(x) for x in os.environ.get("SIZES", "256,1024,4096,16384").split(",")]
CASES = [("qk", "8b", 32, 8, 128), ("qk", "70b", 64, 8, 128), ("qk", "8b-rot64", 32, 8, 64),
         ("rope", "8b", 32, 8, 128), ("rope", "70b", 64, 8, 128)]
for op, model, nq, nk, rotary_dim in CASES:
    cache = cp.asarray(_host_cache(rotary_dim))
    qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    for n in SIZES:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * rotary_dim * 4 + n * 8
        if op == "rope" and rotary_dim < 128:
            nbytes -= 2 * n * (nq + nk) * (128 - rotary_dim) * 2

        def call(q, k):
            if op == "qk":
                return cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
            return cupykern.apply_rope(q, k, pos, cache, check_positions=False)

        q, k = q0.copy(), k0.copy()
        with launcher.recording() as rec:
            call(q, k)
        (L,) = rec
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        block = L.block[0]
        occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(L.function.ptr, block, L.shared_mem)
        tpb = L.plan.tokens_per_block
        blocks = -(-n // tpb)
        grids = {"lib": L.grid[0], "blocks": blocks}
        for w in (1, 2, 3, 4):
            grids[f"w{w}"] = min(blocks, w * occ * SMS)
        print(f"{op} {model} n={n} plan {L.plan} block {block} occ {occ} regs {L.kernel.num_regs} grids {grids}",
              flush=True)
        # The recorded call's q and k (apply_rope in place passes each twice: out and in).
        args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in L.args)
        seen = {}
        for gname, grid in grids.items():
            if grid in seen.values() and gname != "lib":
                continue
            seen[gname] = grid
            qc, kc = q0.copy(), k0.copy()
            L.function((grid, 1, 1), L.block, args_of(qc, kc), L.shared_mem)
            ok = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
            fn = lambda: L.function((grid, 1, 1), L.block, args_of(q, k), L.shared_mem)
            t = time_cold(fn, repeat=30)
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / res["copy_gbps"] * 100
            res["points"].append({"op": op, "model": model, "num_tokens": n, "grid_name": gname, "grid": grid,
                                  "block": block, "occupancy": occ, "regs": L.kernel.num_regs,
                                  "heads_per_thread": L.plan.heads_per_thread, "us": t.median_us,
                                  "pct_copy": pct, "bitwise_ok": ok})
            print(f"{op:4s} {model:8s} n={n:5d} {gname:6s} grid {grid:5d} {t.median_us:8.2f} us {pct:5.1f} % "
                  f"bits {'equal' if ok else 'DIFFER'}", flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "grid_waves.json"), "w") as fh:
    json.dump(res, fh, indent=1)
