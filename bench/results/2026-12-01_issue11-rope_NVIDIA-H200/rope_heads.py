"""apply_rope at prefill sizes under each heads-per-thread choice alone and the default
rule (library kernel, cold L2, random positions, bits compared across choices)."""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern import plans, launcher
from cupykern.timing import time_cold, time_graph, copy_bandwidth
from cupykern.registry.rope import _host_cache

copy = copy_bandwidth()
print(f"copy {copy:.0f} GB/s", flush=True)
rng = np.random.default_rng(1)
cache = cp.asarray(_host_cache(128))
res = {"copy_gbps": copy, "points": []}
default = plans.ROPE_WIDE_HEADS_CHOICES
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8), ("qwen2.5-7b", 28, 4)):
    for n in (4096, 16384):
        positions = cp.asarray(rng.integers(0, cache.shape[0], n))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(ml_dtypes.bfloat16))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(ml_dtypes.bfloat16))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * 8
        want = None
        for choices in ("default", (2,), (3,), (4,), (5,)):
            plans.ROPE_WIDE_HEADS_CHOICES = default if choices == "default" else choices
            plans.ROPE_WIDE_HEADS_PER_THREAD = plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD = \
                min(plans.ROPE_WIDE_HEADS_CHOICES)
            launcher.clear_caches()
            plan = plans.plan_rope(n, nq + nk, 128, 128, q0.dtype, max_vec_width=8, fused_norm=False,
                                   limits=plans.DeviceLimits.of_device(0))
            qc, kc = q0.copy(), k0.copy()
            cupykern.apply_rope(qc, kc, positions, cache, check_positions=False)
            bits = (qc.view(cp.uint16).copy(), kc.view(cp.uint16).copy())
            same = None if want is None else bool((bits[0] == want[0]).all() and (bits[1] == want[1]).all())
            want = want or bits
            fn = lambda: cupykern.apply_rope(qc, kc, positions, cache, check_positions=False)
            t = time_graph(fn) if n < 256 else time_cold(fn, repeat=30)
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / copy * 100
            row = {"model": model, "num_tokens": n, "choices": str(choices), "heads_per_thread": plan.heads_per_thread,
                   "block": plan.block_size, "tokens_per_block": plan.tokens_per_block, "us": t.median_us,
                   "pct_copy": pct, "same_bits_as_default": same}
            res["points"].append(row)
            print(row, flush=True)
plans.ROPE_WIDE_HEADS_CHOICES = default
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "rope_heads.json"), "w"), indent=1)
