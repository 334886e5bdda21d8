"""qk_rms_norm_rope's wide kernel at 5 heads a thread (NOTES item 33).

Since item 32 (32-bit sizes, no stack frame) the 5-heads instantiation no longer spills at
its 128 registers (ptxas, sm_90, bf16 and fp32), where ROPE_WIDE_NORM_HEADS_CHOICES stops
at 4 for that spill. llama-3.1-8b's 40 heads at 5 a thread fill a 256-thread block (4 tokens
of 8 slots x 8 lanes); item 31's hand-written H5 led its H4 by 1.4-2.5 %. Each library call
(bf16, fp32 cache, int64 positions, in place; occupancy-based grid) is recorded, then the
library's kernel with H heads launched directly: head_slots = ceil(heads / H), tokens a block
to fill 256 threads, grid min(token groups, W x occupancy x SMs). Cold L2; bits against the
library call.
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

SEED = 20261203
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "sms": SMS, "points": [], "kernels": {}}
print(f"copy {res['copy_gbps']:.0f} GB/s", flush=True)
SIZES = [int(x) for x in os.environ.get("SIZES", "1024,4096,16384").split(",")]
for model, nq, nk, rotary_dim in (("8b", 32, 8, 128), ("70b", 64, 8, 128), ("8b-rot64", 32, 8, 64)):
    cache = cp.asarray(_host_cache(rotary_dim))
    qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    nh = nq + nk
    for n in SIZES:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * rotary_dim * 4 + n * 8
        q, k = q0.copy(), k0.copy()
        with launcher.recording() as rec:
            cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
        (L,) = rec
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        lead = ("__nv_bfloat16", "float", "long long", True, 8, 8)
        variants = {"lib": (L.function, L.grid[0], L.block[0], L.args)}
        for h in (3, 4, 5):
            f = jit.get_kernel(rope_ops.QK_RMS_NORM_ROPE_WIDE, *lead, h, rotary_dim < 128)
            slots = -(-nh // h)
            tpb = max(1, 256 // (slots * 8))
            block = -(-slots * 8 * tpb // 32) * 32
            occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, block, 0)
            res["kernels"][f"H{h} {model}"] = {"regs": f.num_regs, "local": f.local_size_bytes, "occupancy": occ}
            args = (*L.args[:-2], np.int32(slots), np.int32(tpb))
            for w in (1, 2):
                variants[f"H{h} w{w}"] = (f.kernel, min(-(-n // tpb), w * occ * SMS), block, args)
        print(model, n, "lib plan", L.plan, {k: v[1:3] for k, v in variants.items()}, flush=True)
        for name, (fn, grid, block, args) in variants.items():
            args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in args)
            qc, kc = q0.copy(), k0.copy()
            fn((grid, 1, 1), (block, 1, 1), args_of(qc, kc), 0)
            ok = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
            t = time_cold(lambda: fn((grid, 1, 1), (block, 1, 1), args_of(q, k), 0), repeat=30)
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / res["copy_gbps"] * 100
            res["points"].append({"model": model, "num_tokens": n, "variant": name, "grid": grid, "block": block,
                                  "us": t.median_us, "pct_copy": pct, "bitwise_ok": ok})
            print(f"{model:8s} n={n:5d} {name:6s} grid {grid:5d} block {block:3d} {t.median_us:8.2f} us {pct:5.1f} % "
                  f"bits {'equal' if ok else 'DIFFER'}", flush=True)
print(json.dumps(res["kernels"]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "qk_heads.json"), "w") as fh:
    json.dump(res, fh, indent=1)
