"""apply_rope's wide kernel walking tokens grid-stride (plans.ROPE_WIDE_GRID_WAVES
waves of ROPE_WIDE_BLOCKS_PER_SM blocks an SM) with the next token's position requested
one iteration ahead (PREFETCH: its cos/sin load then leaves with the q/k loads instead
of waiting for the position), against the block per group of tokens (waves 0), each
heads-per-thread choice. In place, bf16, random int64 positions, cold L2, bits checked
against the unpatched source's default plan."""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern import jit, launcher, plans
from cupykern.timing import time_cold, copy_bandwidth
from cupykern.registry.rope import _host_cache

BASE = jit.source("rope.cu")
WIDE = BASE.index("int kHeadsPerThread, bool kInPlace>")
OLD = """  for (int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub; token < num_tokens;
       token += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);"""
NEW = """  const int64_t token_step = static_cast<int64_t>(gridDim.x) * tokens_per_block;
  int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub;
  TPos pos_next = token < num_tokens ? positions[token * positions_stride] : TPos(0);
  for (; token < num_tokens; token += token_step) {
    const int64_t pos = static_cast<int64_t>(pos_next);
    if (token + token_step < num_tokens) pos_next = positions[(token + token_step) * positions_stride];"""
assert BASE[WIDE:].count(OLD) == 1
PREFETCH = BASE[:WIDE] + BASE[WIDE:].replace(OLD, NEW, 1)
original_source = jit.source


def use(text, waves, choices):
    jit.source = lambda f: text if f == "rope.cu" else original_source(f)
    plans.ROPE_WIDE_GRID_WAVES = waves
    if choices:
        plans.ROPE_WIDE_HEADS_CHOICES = choices
        plans.ROPE_WIDE_HEADS_PER_THREAD = plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD = min(choices)
    jit._kernels.clear()
    launcher.clear_caches()


DEFAULTS = (plans.ROPE_WIDE_HEADS_CHOICES, plans.ROPE_WIDE_HEADS_PER_THREAD, plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD)
copy = copy_bandwidth()
print(f"copy {copy:.0f} GB/s", flush=True)
rng = np.random.default_rng(20261203)
cache = cp.asarray(_host_cache(128))
res = {"copy_gbps": copy, "seed": 20261203, "points": []}
VARIANTS = [("plain", BASE, 0), ("plain", BASE, 2), ("prefetch", PREFETCH, 1), ("prefetch", PREFETCH, 2),
            ("prefetch", PREFETCH, 4)]
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
    for n in (1024, 4096, 16384):
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(ml_dtypes.bfloat16))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(ml_dtypes.bfloat16))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * 8
        use(BASE, 0, None)
        q, k = q0.copy(), k0.copy()
        cupykern.apply_rope(q, k, pos, cache, check_positions=False)
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        for choices in (None, (3,), (4,), (5,)):
            for name, text, waves in VARIANTS:
                use(text, waves, choices)
                plan = plans.plan_rope(n, nq + nk, 128, 128, q0.dtype, max_vec_width=8, fused_norm=False,
                                       limits=plans.DeviceLimits.of_device(0))
                q, k = q0.copy(), k0.copy()
                cupykern.apply_rope(q, k, pos, cache, check_positions=False)
                ok = bool((q.view(cp.uint16) == want[0]).all() and (k.view(cp.uint16) == want[1]).all())
                t = time_cold(lambda: cupykern.apply_rope(q, k, pos, cache, check_positions=False), repeat=30)
                pct = nbytes / (t.median_us * 1e-6) / 1e9 / copy * 100
                row = {"model": model, "num_tokens": n, "variant": name, "waves": waves,
                       "choices": "default" if choices is None else str(choices), "heads": plan.heads_per_thread,
                       "grid": plan.grid[0], "block": plan.block_size, "us": t.median_us, "pct_copy": pct,
                       "bitwise_ok": ok}
                res["points"].append(row)
                print(f"{model:3s} n={n:5d} {row['choices']:7s} h{plan.heads_per_thread} {name:8s} waves {waves} "
                      f"grid {plan.grid[0]:5d} {t.median_us:8.2f} us {pct:5.1f} % ok {ok}", flush=True)
            plans.ROPE_WIDE_HEADS_CHOICES, plans.ROPE_WIDE_HEADS_PER_THREAD, plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD = DEFAULTS
with open(os.path.join(os.environ.get("OUT", "."), "rope_prefetch.json"), "w") as fh:
    json.dump(res, fh, indent=1)
