"""Why is the library's apply_rope_wide_kernel slower than ab/rope_iso.py's kernel of the
same structure? The library source with one change at a time, same launch, same
inputs (8b: 32 + 8 heads, 2 heads a thread, a block per token), bit-checked against
cupykern.apply_rope; SASS of the unchanged kernel and of the hand-written one."""
import json, os, re, subprocess
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern import jit
from cupykern.timing import time_cold
from cupykern.registry.rope import _host_cache
from cupy_backends.cuda.libs import nvrtc

OUT = os.environ.get("OUT", ".")
BASE = jit.source("rope.cu")
WIDE = BASE.index("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks")
PATCHES = {
    "nou": ("for (int64_t u = th.lane; u < units; u += threads_per_head) {\n      int64_t lo, hi;",
            "{ const int64_t u = th.lane;\n      int64_t lo, hi;"),
    "noh0": ("for (int64_t h0 = th.slot; h0 < num_heads; h0 += head_step) {", "{ const int64_t h0 = th.slot;"),
    "novalid": ("""          if (!valid) {  // in place: not written; out of place: copied unchanged
            if (copy_unrotated) {
              store_vec<T, kVecWidth>(out + lo, va[j]);
              store_vec<T, kVecWidth>(out + hi, vb[j]);
            }
            continue;
          }""", ""),
    "nominblocks": ("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks<kHeadsPerThread, kMropeLayout>())",
                    "__launch_bounds__(kRopeMaxBlockSize)"),
    "nopass": ("if (copy_unrotated && pass_vecs > 0) {\n      for (int64_t h = th.slot; h < num_heads; h += head_slots) {\n        const bool is_q",
               "if (false) {\n      for (int64_t h = th.slot; h < num_heads; h += head_slots) {\n        const bool is_q"),
}
VARIANTS = {"base": [], **{k: [k] for k in PATCHES}, "all": list(PATCHES)}


def patched(names):
    head, tail = BASE[:WIDE], BASE[WIDE:]
    for n in names:
        old, new = PATCHES[n]
        assert tail.count(old) >= 1, n
        tail = tail.replace(old, new, 1)
    return head + tail


def cubin_sass(src, expr, tag):
    prog = nvrtc.createProgram(src, "rope.cu", (), ())
    nvrtc.addNameExpression(prog, expr)
    nvrtc.compileProgram(prog, [*jit.nvrtc_options("90")])
    path = f"/tmp/{tag}.cubin"
    open(path, "wb").write(nvrtc.getCUBIN(prog))
    low = nvrtc.getLoweredName(prog, expr)
    r = subprocess.run(["/usr/local/cuda/bin/cuobjdump", "-sass", path], capture_output=True, text=True)
    open(os.path.join(OUT, f"sass_{tag}.txt"), "w").write(r.stdout + r.stderr)


rng = np.random.default_rng(0)
bf = ml_dtypes.bfloat16
cache = cp.asarray(_host_cache(128))
res = []
for model, nq, nk, heads, slots in (("8b", 32, 8, 2, 20), ("70b", 64, 8, 2, 32)):
    nh = nq + nk
    for n in (4096, 16384):
        for pos_dtype in (np.int64, np.int32):
            positions = cp.asarray(rng.integers(0, cache.shape[0], n).astype(pos_dtype))
            q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
            k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
            nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * positions.itemsize
            q, k = q0.copy(), k0.copy()
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
            want = (q.copy(), k.copy())
            t = time_cold(lambda: cupykern.apply_rope(q, k, positions, cache, check_positions=False), repeat=30)
            print(f"{model} n={n} pos {np.dtype(pos_dtype).name} lib {t.median_us:.2f} us", flush=True)
            res.append({"model": model, "n": n, "pos": np.dtype(pos_dtype).name, "variant": "lib", "us": t.median_us})
            tpos = "long long" if pos_dtype == np.int64 else "int"
            expr = f"apply_rope_wide_kernel<__nv_bfloat16, float, {tpos}, true, 8, 0, {heads}>"
            for name, patches in VARIANTS.items():
                mod = cp.RawModule(code=patched(patches), options=jit.COMPILE_OPTIONS, name_expressions=[expr])
                f = mod.get_function(expr)
                i64 = lambda *v: [np.int64(x) for x in v]
                args_tail = (*i64(n, nq, nk, 128, 128, cache.shape[0], 1, nq * 128, 128, nk * 128, 128, nq * 128, 128,
                                  nk * 128, 128, 128),
                             np.int32(8), np.int32(slots), np.int32(1), np.int32(0), np.int64(0),
                             np.int32(0), np.int32(0), np.int32(0))
                qc, kc = q0.copy(), k0.copy()
                f((n,), (slots * 8,), (qc, kc, qc, kc, positions, cache, *args_tail))
                ok = bool((qc.view(cp.uint16) == want[0].view(cp.uint16)).all()
                          and (kc.view(cp.uint16) == want[1].view(cp.uint16)).all())
                t = time_cold(lambda: f((n,), (slots * 8,), (q, k, q, k, positions, cache, *args_tail)), repeat=30)
                pct = nbytes / (t.median_us * 1e-6) / 1e9 / 4250 * 100
                print(f"{model} n={n} pos {np.dtype(pos_dtype).name} {name:12s} {t.median_us:8.2f} us ~{pct:5.1f} % "
                      f"regs {f.num_regs} local {f.local_size_bytes} ok {ok}", flush=True)
                res.append({"model": model, "n": n, "pos": np.dtype(pos_dtype).name, "variant": name,
                            "us": t.median_us, "regs": f.num_regs, "ok": ok})
json.dump(res, open(os.path.join(OUT, "rope_lib.json"), "w"), indent=1)
for tag, names in (("base", []), ("all", list(PATCHES))):
    cubin_sass(patched(names), "apply_rope_wide_kernel<__nv_bfloat16, float, long long, true, 8, 0, 2>", tag)
iso = open("ab/rope_iso.py").read().split("SRC = r'''")[1].split("'''")[0]
cubin_sass(iso, "rope_x<2,0,1>", "iso")
