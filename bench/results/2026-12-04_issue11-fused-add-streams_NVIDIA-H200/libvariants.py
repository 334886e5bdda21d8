"""Where do the library's fused add and call A's stand-alone copy of its layout differ
(1.5 % at 4096 x 4096 bf16, NOTES item 38, call A)? NOTES item 38, call B.

Builds norm.cu's fused_add_rms_norm_kernel<bf16, P, 8, 2, 32, exact> from its inlined
source (cupykern.jit.source) with patches, and times each with cold L2 (three rounds,
rotating order) beside the library call and call A's stand-alone:
  lib       cupykern.fused_add_rms_norm
  src       the same source built here, unpatched (must read as lib)
  wlast     the weight leaves requested after the row's x and residual leaves
            (kWeightsFirst off), not as the kernel's first loads
  reduce1   the block sum of call A's stand-alone (one warp butterfly, one barrier)
            instead of the fixed tree (other bits: attribution only)
  both      wlast and reduce1
  lb        __launch_bounds__ asking for 1536 resident threads an SM (ptxas: 47 -> 40
            registers, 5 -> 6 blocks of 256 threads, 2 -> 3 of 512; no spill)
  fused     call A's stand-alone (streams.py's rowblock<P, true, 0, 0>)
Then GPU time by graph replay at 1, 16 and 64 rows for lib, src, wlast and lb (the same
instantiation serves decode sizes). Writes each build's SASS (cuobjdump) and its instruction count, registers and static
shared memory.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import cupy
import numpy as np

import cupykern
from cupykern import jit, timing

HERE = Path(__file__).resolve().parent
OUT = Path(sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", "."))


def patched(src: str, *, wlast: bool = False, reduce1: bool = False, min_threads: int = 0) -> str:
    def sub(old, new):
        nonlocal src
        assert src.count(old) == 1, old
        src = src.replace(old, new)

    if wlast:
        sub("constexpr bool kWeightsFirst = kFusedAdd && kOneRowPerBlock;", "constexpr bool kWeightsFirst = false;")
        sub("    if constexpr (kCacheWeight && !kWeightsFirst) {\n",
            "    if constexpr (kCacheWeight && !kWeightsFirst && !kFusedAdd) {\n")
        sub("[&](int64_t v) { return load_leaf<T, kVecWidth>(res_row, v, L); });\n",
            "[&](int64_t v) { return load_leaf<T, kVecWidth>(res_row, v, L); });\n"
            "      if constexpr (kCacheWeight) load_shared_first_round<T, kThreadsPerRow, kVecWidth, kExact>("
            "weight, hidden_size, g.lane, weight_cache);\n")
    if min_threads:
        sub("__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) fused_add_rms_norm_kernel(",
            f"__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>(), {min_threads} / "
            "max_block_size<kThreadsPerRow>()) fused_add_rms_norm_kernel(")
    if reduce1:
        sub("const float sumsq = row_tree_reduce<SumOp, kThreadsPerRow, kVecsPerThread, kWarpSize>(column, scratch_pair);",
            "float part = column[0];\n#pragma unroll\n    for (int a = 1; a < kVecsPerThread; ++a) part += column[a];\n"
            "    const float sumsq = row_group_reduce_impl<SumOp, kThreadsPerRow, kWarpSize, false>(part, scratch_pair.next());")
    return src


base = jit.source("norm.cu")
sources = {"src": base, "wlast": patched(base, wlast=True), "reduce1": patched(base, reduce1=True),
           "both": patched(base, wlast=True, reduce1=True), "lb": patched(base, min_threads=1536)}
standalone = (HERE / "streams.py").read_text().split('SRC = r"""')[1].split('"""')[0]
sources["fused"] = standalone

from cupy_backends.cuda.libs import nvrtc  # noqa: E402


def sass(name, code, exprs):
    """cuobjdump -sass of the sm_90 cubin of ``exprs`` (written beside the results)."""
    prog = nvrtc.createProgram(code, name + ".cu", (), ())
    for e in exprs:
        nvrtc.addNameExpression(prog, e)
    nvrtc.compileProgram(prog, [*jit.nvrtc_options("90")])
    cubin = OUT / f"{name}.cubin"
    cubin.write_bytes(nvrtc.getCUBIN(prog))
    nvrtc.destroyProgram(prog)
    text = subprocess.run(["/usr/local/cuda/bin/cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
    (OUT / f"{name}.sass").write_text(text)
    cubin.unlink()
    return len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", text, re.MULTILINE))


seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "builds": {}}
for rows, hidden in ((4096, 4096), (4096, 8192), (16384, 4096)):
    P = hidden // 16
    lib_expr = f"fused_add_rms_norm_kernel<__nv_bfloat16, {P}, 8, 2, 32, true>"
    alone_expr = f"rowblock<{P}, true, 0, 0>"
    kernels = {}
    for name, code in sources.items():
        expr = alone_expr if name == "fused" else lib_expr
        k = cupy.RawModule(code=code, options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)
        kernels[name] = k
        results["builds"][f"{name} P={P}"] = {"registers": k.num_regs, "static_smem": k.shared_size_bytes,
                                             "sass_instructions": sass(f"{name}_P{P}", code, [expr])}
    x0, r0, w = (cupy.asarray(rng.standard_normal(s, dtype=np.float32).astype(cupykern.bfloat16))
                 for s in ((rows, hidden), (rows, hidden), (hidden,)))
    x, r = x0.copy(), r0.copy()
    eps = np.float32(1e-6)
    fns = {"lib": lambda: cupykern.fused_add_rms_norm(x, r, w, 1e-6)}
    for name, k in kernels.items():
        if name == "fused":
            fns[name] = lambda k=k: k((rows,), (P,), (x, r, w, np.int32(rows), eps))
        else:
            fns[name] = lambda k=k: k((rows,), (P,), (x, r, w, np.int64(rows), np.int64(hidden), np.int64(hidden),
                                                    np.int64(hidden), eps, np.float32(0)))
    ref_x, ref_r = x0.copy(), r0.copy()
    cupykern.fused_add_rms_norm(ref_x, ref_r, w, 1e-6)
    check = {}
    for name in kernels:
        x[...], r[...] = x0, r0
        fns[name]()
        check[name] = {"x_bitwise": bool((x.view(cupy.uint16) == ref_x.view(cupy.uint16)).all()),
                       "residual_bitwise": bool((r.view(cupy.uint16) == ref_r.view(cupy.uint16)).all()),
                       "max_abs_diff_x": float(cupy.abs(x.astype(cupy.float32) - ref_x.astype(cupy.float32)).max())}
    print(rows, hidden, "check", check, flush=True)
    src_, dst = cupy.empty(2 * rows * hidden * 2, dtype=cupy.uint8), cupy.empty(2 * rows * hidden * 2, dtype=cupy.uint8)
    rt = cupy.cuda.runtime
    fns["copy_same"] = lambda: rt.memcpyAsync(dst.data.ptr, src_.data.ptr, src_.size, rt.memcpyDeviceToDevice,
                                              cupy.cuda.get_current_stream().ptr)
    med = {k: [] for k in fns}
    order = list(fns)
    for rnd in range(3):
        for k in order[rnd:] + order[:rnd]:
            med[k].append(timing.time_cold(fns[k], repeat=30).median_us)
    best_copy = min(med["copy_same"])
    results["points"].append({"rows": rows, "hidden": hidden, "check": check, "us": med,
                              "pct_of_copy_same": {k: 100 * best_copy / min(v) for k, v in med.items()}})
    print(f"{rows} x {hidden}: " + ", ".join(f"{k} {' '.join(f'{t:.2f}' for t in v)} ({100 * best_copy / min(v):.1f} %)"
                                            for k, v in med.items()), flush=True)
    del x, r, x0, r0, src_, dst
# Decode sizes: the same instantiations, graph replay.
results["decode"] = []
for hidden in (4096, 8192):
    P = hidden // 16
    expr = f"fused_add_rms_norm_kernel<__nv_bfloat16, {P}, 8, 2, 32, true>"
    ks = {n: cupy.RawModule(code=sources[n], options=jit.COMPILE_OPTIONS, name_expressions=[expr]).get_function(expr)
          for n in ("src", "wlast", "lb")}
    for rows in (1, 16, 64):
        x, r, w = (cupy.asarray(rng.standard_normal(s, dtype=np.float32).astype(cupykern.bfloat16))
                   for s in ((rows, hidden), (rows, hidden), (hidden,)))
        fns = {"lib": lambda: cupykern.fused_add_rms_norm(x, r, w, 1e-6)}
        for n, k in ks.items():
            fns[n] = lambda k=k: k((rows,), (P,), (x, r, w, np.int64(rows), np.int64(hidden), np.int64(hidden),
                                                 np.int64(hidden), np.float32(1e-6), np.float32(0)))
        med = {k: [] for k in fns}
        order = list(fns)
        for rnd in range(3):
            for k in order[rnd % len(order):] + order[:rnd % len(order)]:
                med[k].append(timing.time_graph(fns[k]).median_us)
        results["decode"].append({"rows": rows, "hidden": hidden, "us": med})
        print(f"decode {rows} x {hidden}: " + ", ".join(f"{k} {' '.join(f'{t:.3f}' for t in v)}" for k, v in med.items()),
              flush=True)
print(json.dumps(results["builds"], indent=1))
json.dump(results, open(OUT / "libvariants.json", "w"), indent=1)
