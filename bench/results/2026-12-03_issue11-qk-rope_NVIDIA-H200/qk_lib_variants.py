"""Why is the library's qk_rms_norm_rope_wide_kernel 10-17 % (prefill) and 0.5 us (decode)
slower than qk_iso.py's hand-written kernels of the same structure (call A)? The library
kernel (this tree's rope.cu) copied and patched one change at a time, each launched
directly with the library's plan for the shape, bits checked against the library:
  i32     sizes, strides and head indices in 32 bits (token offsets 64-bit), as
          apply_rope_wide_kernel and the hand-written kernels
  nopass  no pass-through dims (has_pass false at compile time; head_dim = rotary_dim)
  both
bf16, llama-3.1-8b / -70b heads, 1 / 64 tokens (graph replay) and 4096 / 16384 (cold L2).
"""
import json, os, re
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern import jit, plans
from cupykern.timing import time_cold, time_graph, copy_bandwidth
from cupykern.registry.rope import _host_cache

SRC = jit.source("rope.cu")
KERNEL = SRC[SRC.index("template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead,\n"
                       "          int kHeadsPerThread>\n__global__ void __launch_bounds__(kRopeMaxBlockSize, kQkWideMinBlocksPerSm)"):]


def variant(name, i32, nopass):
    k = KERNEL.replace("qk_rms_norm_rope_wide_kernel(", f"qk_{name}_kernel(")
    if i32:
        head, body = k.split(") {", 1)
        head = head.replace("int64_t ", "int ")
        body = re.sub(r"const int64_t (half|units|pass_vecs|num_heads|p_off)", r"const int \1", body)
        body = body.replace("int64_t lo, hi;\n  unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo, hi);",
                            "int lo, hi;\n  { int64_t l, h; unit_offsets<kIsNeox, kVecWidth>(th.lane, half, l, h); lo = (int)l; hi = (int)h; }")
        body = body.replace("const int64_t h = th.slot + j * static_cast<int64_t>(head_slots);",
                            "const int h = th.slot + j * head_slots;")
        body = body.replace("th.slot + j * static_cast<int64_t>(head_slots) < num_heads", "th.slot + j * head_slots < num_heads")
        body = body.replace("auto head_ptr = [&](int64_t h) -> T* {", "auto head_ptr = [&](int h) -> T* {")
        body = body.replace("static_cast<int64_t>(th.lane) * kVecWidth", "th.lane * kVecWidth")
        k = head + ") {" + body
    if nopass:
        k = k.replace("const bool has_pass = th.lane < pass_vecs;", "constexpr bool has_pass = false;")
    return k


VARIANTS = {"lib": (False, False), "i32": (True, False), "nopass": (False, True), "both": (True, True)}
CODE = SRC + "".join(variant(n, *v) for n, v in VARIANTS.items())
HEADS = (2, 3, 4)
NAMES = [f"qk_{n}_kernel<__nv_bfloat16, float, long long, true, 8, 8, {h}>" for n in VARIANTS for h in HEADS]
mod = cp.RawModule(code=CODE, options=jit.COMPILE_OPTIONS, name_expressions=NAMES)
res = {"copy_gbps": copy_bandwidth(), "seed": 20261203, "kernels": {}, "points": []}
print(f"copy {res['copy_gbps']:.0f} GB/s", flush=True)
for nm in NAMES:
    f = mod.get_function(nm)
    res["kernels"][nm] = {"regs": f.num_regs, "local": f.local_size_bytes}
    print(nm, f.num_regs, "regs", f.local_size_bytes, "local", flush=True)
rng = np.random.default_rng(20261203)
bf = ml_dtypes.bfloat16
cache = cp.asarray(_host_cache(128))
EPS = 1e-6
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
    qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    for n in (1, 64, 4096, 16384):
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * 8
        q, k = q0.copy(), k0.copy()
        cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False)
        want = (q.view(cp.uint16).copy(), k.view(cp.uint16).copy())
        plan = plans.plan_rope(n, nq + nk, 128, 128, q0.dtype, max_vec_width=8, fused_norm=True,
                               limits=plans.DeviceLimits.of_device(0))
        sizes = (n, nq, nk, 128, 128, cache.shape[0], 1, nq * 128, 128, nk * 128, 128, 128)
        for vname, (i32, _) in VARIANTS.items():
            f = mod.get_function(f"qk_{vname}_kernel<__nv_bfloat16, float, long long, true, 8, 8, {plan.heads_per_thread}>")
            ints = tuple(map(np.int32 if i32 else np.int64, sizes))
            args = (pos, cache, *ints, np.float32(EPS), np.int32(plan.head_slots), np.int32(plan.tokens_per_block))
            qc, kc = q0.copy(), k0.copy()
            f(plan.grid, plan.block, (qc, kc, qw, kw, *args))
            ok = bool((qc.view(cp.uint16) == want[0]).all() and (kc.view(cp.uint16) == want[1]).all())
            fn = lambda: f(plan.grid, plan.block, (q, k, qw, kw, *args))  # noqa: E731
            t, kind = (time_graph(fn), "graph") if n <= 64 else (time_cold(fn, repeat=30), "cold")
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / res["copy_gbps"] * 100
            res["points"].append({"model": model, "num_tokens": n, "variant": vname, "heads": plan.heads_per_thread,
                                  "us": t.median_us, "timing": kind, "pct_copy": pct, "bitwise_ok": ok})
            print(f"{model:3s} n={n:5d} {vname:7s} H{plan.heads_per_thread} {t.median_us:8.2f} us {pct:5.1f} % ok {ok}",
                  flush=True)
with open(os.path.join(os.environ.get("OUT", "."), "qk_lib_variants.json"), "w") as fh:
    json.dump(res, fh, indent=1)
