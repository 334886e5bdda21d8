"""RoPE's wide kernels with the next token's position requested a token ahead (NOTES item 35).

At 4096 tokens apply_rope reaches 85.7 % (llama-3.1-8b) and 89.7 % (70b) of the copy, at
16384 93.8 / 94.5 %: from the two sizes its time is about 2.7 us (8b) plus a per-token
slope at 94.5 % of the copy, where Liger's (cos/sin gathered before its call) is 1.2 us
plus the same slope. Each token of the wide kernels waits out position -> cos/sin (two
dependent round trips) while its q/k loads take one. Here rope.cu is rebuilt with the next
token's position loaded during the current token (a grid-stride walk, so in waves of the
kernel's occupancy), and both kernels, library and rebuilt, run in a block per token group
("b") and in 1, 2 or 4 waves ("w1", "w2", "w4"). Each library call (bf16, fp32 cache, int64
positions, in place; apply_rope then qk_rms_norm_rope) is recorded and relaunched with the
same arguments; two passes (the second in reverse order), cold L2, the copy in the same
run, bits of every variant against the library call's.
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

SEED = 20261205
rng = np.random.default_rng(SEED)
bf = ml_dtypes.bfloat16
EPS = 1e-6
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
res = {"copy_gbps": copy_bandwidth(), "seed": SEED, "sms": SMS, "points": [], "kernels": {}}
print(f"copy {res['copy_gbps']:.0f} GB/s, {SMS} SMs", flush=True)

SOURCE = jit.source("rope.cu")
PATCHES = [
    # apply_rope_wide_kernel
    ("""  for (int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub; token < num_tokens;
       token += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);
    int64_t pos_h = 0, pos_w = 0;""",
     """  const int64_t step = static_cast<int64_t>(gridDim.x) * tokens_per_block;
  int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub;
  int64_t next_pos = token < num_tokens ? static_cast<int64_t>(positions[token * positions_stride]) : 0;
  for (; token < num_tokens; token += step) {
    const int64_t pos = next_pos;
    if (token + step < num_tokens) next_pos = static_cast<int64_t>(positions[(token + step) * positions_stride]);
    int64_t pos_h = 0, pos_w = 0;"""),
    # qk_rms_norm_rope_wide_kernel
    ("""  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens;
       base += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = in_range ? static_cast<int64_t>(positions[token * positions_stride]) : -1;""",
     """  const int64_t step = static_cast<int64_t>(gridDim.x) * tokens_per_block;
  auto position_of = [&](int64_t b) -> int64_t {
    const int64_t t = b + th.tok_sub;
    return th.tok_sub < tokens_per_block && t < num_tokens ? static_cast<int64_t>(positions[t * positions_stride]) : -1;
  };
  int64_t next_pos = position_of(static_cast<int64_t>(blockIdx.x) * tokens_per_block);
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens; base += step) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    const int64_t pos = next_pos;
    next_pos = position_of(base + step);"""),
]
PATCHED = SOURCE
for old, new in PATCHES:
    assert PATCHED.count(old) == 1, old[:80]
    PATCHED = PATCHED.replace(old, new)
_modules = {}


def prefetching(op, expr):
    """The kernel `expr` of rope.cu with the position a token ahead."""
    if expr not in _modules:
        _modules[expr] = cp.RawModule(code=PATCHED, options=jit.COMPILE_OPTIONS,
                                      name_expressions=[expr]).get_function(expr)
    return _modules[expr]


cache = cp.asarray(_host_cache(128))
qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
EXPRS = {
    "apply_rope": lambda h: rope_ops.APPLY_ROPE_WIDE.expr("__nv_bfloat16", "float", "long long", True, 8, 0, h, True),
    "qk_rms_norm_rope": lambda h: rope_ops.QK_RMS_NORM_ROPE_WIDE.expr("__nv_bfloat16", "float", "long long", True, 8,
                                                                      8, h, False),
}
for op in os.environ.get("OPS", "apply_rope,qk_rms_norm_rope").split(","):
    for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
        for n in [int(x) for x in os.environ.get("SIZES", "2048,4096,8192,16384").split(",")]:
            pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
            q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
            k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
            nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 128 * 4 + n * 8
            q, k = q0.copy(), k0.copy()
            with launcher.recording() as rec:
                if op == "apply_rope":
                    cupykern.apply_rope(q, k, pos, cache, check_positions=False)
                else:
                    cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
            (L,) = rec
            want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
            p = L.plan
            tpb, block = p.tokens_per_block, L.block[0]
            rebuilt = prefetching(op, EXPRS[op](p.heads_per_thread))
            kernels = {"lib": L.function, "ahead": rebuilt.kernel}
            res["kernels"][f"{op} {model} ahead"] = {"regs": rebuilt.num_regs, "local": rebuilt.local_size_bytes}
            occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(L.function.ptr, block, 0)
            occ_ahead = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(rebuilt.kernel.ptr, block, 0)
            blocks = -(-n // tpb)
            variants = {"lib": (L.function, L.grid[0])}
            for kname, fn in kernels.items():
                o = occ if kname == "lib" else occ_ahead
                for gname, grid in {"b": blocks, "w1": min(blocks, o * SMS), "w2": min(blocks, 2 * o * SMS),
                                    "w4": min(blocks, 4 * o * SMS)}.items():
                    if kname == "lib" and grid == L.grid[0]:
                        continue
                    variants[f"{kname} {gname}"] = (fn, grid)
            print(op, model, n, "lib plan", p, "occupancy", occ, occ_ahead, flush=True)
            times, oks = {v: [] for v in variants}, {}
            for rep in (0, 1):
                for name in (list(variants) if rep == 0 else list(variants)[::-1]):
                    fn, grid = variants[name]
                    args_of = lambda qq, kk: tuple(qq if a is q else kk if a is k else a for a in L.args)
                    if rep == 0:
                        qc, kc = q0.copy(), k0.copy()
                        fn((grid, 1, 1), (block, 1, 1), args_of(qc, kc), 0)
                        oks[name] = bool((qc.view(cp.uint16) == want[0]).all()
                                         and (kc.view(cp.uint16) == want[1]).all())
                    times[name].append(time_cold(lambda: fn((grid, 1, 1), (block, 1, 1), args_of(q, k), 0),
                                                 repeat=30).median_us)
            for name, (fn, grid) in variants.items():
                us = times[name]
                pct = [nbytes / (u * 1e-6) / 1e9 / res["copy_gbps"] * 100 for u in us]
                res["points"].append({"op": op, "model": model, "num_tokens": n, "variant": name, "grid": grid,
                                      "block": block, "us": us, "pct_copy": pct, "bitwise_ok": oks[name]})
                print(f"{op:16s} {model:4s} n={n:5d} {name:9s} grid {grid:5d} block {block:3d} {us[0]:8.2f} "
                      f"{us[1]:8.2f} us {pct[0]:5.1f} {pct[1]:5.1f} % bits {'equal' if oks[name] else 'DIFFER'}",
                      flush=True)
print(json.dumps(res["kernels"]), flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "rope_prefetch.json"), "w") as fh:
    json.dump(res, fh, indent=1)
