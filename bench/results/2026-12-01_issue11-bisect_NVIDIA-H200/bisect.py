"""Where cupykern's block-per-item silu_and_mul loses 0.11 us to a hand-written kernel of
the same grid (NOTES item 18), and whether Inductor's Triton kernel is faster under the
same launch (its cubin loaded into CuPy). Torch-free, graph replay (timing.time_graph),
bf16, 8 elements a thread unless named e4. argv[1]: the Triton cache of tc_dump.py."""
import glob, json, os, re, sys
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern import jit
from cupykern.timing import time_graph
bf = ml_dtypes.bfloat16

HAND = r'''
#include <cuda_bf16.h>
typedef long long int64_t;
typedef __nv_bfloat16 T;
template <int E> struct __align__(2 * E) VE { T e[E]; };
template <int E> __device__ __forceinline__ void body(T* o, const T* g, const T* u, int64_t grow, int64_t urow, int64_t orow, int i) {
  VE<E> a = *(const VE<E>*)(g + grow + i);
  VE<E> b = *(const VE<E>*)(u + urow + i);
  VE<E> c;
#pragma unroll
  for (int k = 0; k < E; ++k) { float x = __bfloat162float(a.e[k]);
    float y = __fdividef(x, 1.0f + __expf(-x)); y = x == -__int_as_float(0x7f800000) ? -0.0f : y;
    c.e[k] = __float2bfloat16(y * __bfloat162float(b.e[k])); }
  *(VE<E>*)(o + orow + i) = c;
}
#define MIN_BODY(E) int slot = blockIdx.x * blockDim.x + threadIdx.x; int row = blockIdx.y; \
  if (slot * E >= d) return; body<E>(o, g, u, (long long)row * s, (long long)row * s, (long long)row * d, slot * E);
extern "C" __global__ void h_min(T* o, const T* g, const T* u, int d, int s) { MIN_BODY(8) }
extern "C" __global__ void h_min_e4(T* o, const T* g, const T* u, int d, int s) { MIN_BODY(4) }
extern "C" __global__ void __launch_bounds__(1024) h_lb1024(T* o, const T* g, const T* u, int d, int s) { MIN_BODY(8) }
extern "C" __global__ void __launch_bounds__(128) h_lb128(T* o, const T* g, const T* u, int d, int s) { MIN_BODY(8) }
// The library's parameter list and 64-bit row offsets, no tail.
#define P64_BODY(E) const unsigned slots = ((unsigned)d + E - 1) / E; unsigned slot = blockIdx.x * blockDim.x + threadIdx.x; \
  if (slot >= slots) return; int i = slot * E; int64_t row = blockIdx.y;
extern "C" __global__ void h_p64(T* o, const T* g, const T* u, int64_t n, int64_t d, int64_t gs, int64_t us, int64_t os) {
  P64_BODY(8) if (i + 8 <= d) body<8>(o, g, u, row * gs, row * us, row * os, i); }
// ... and the library's scalar tail.
extern "C" __global__ void h_p64_tail(T* o, const T* g, const T* u, int64_t n, int64_t d, int64_t gs, int64_t us, int64_t os) {
  P64_BODY(8) if (i + 8 <= d) body<8>(o, g, u, row * gs, row * us, row * os, i);
  else for (int j = i; j < d; ++j) { float x = __bfloat162float(g[row * gs + j]);
    o[row * os + j] = __float2bfloat16(__fdividef(x, 1.0f + __expf(-x)) * __bfloat162float(u[row * us + j])); } }
'''
hand = cp.RawModule(code=HAND, options=("--std=c++17",))
EXPR = "act_and_mul_kernel<__nv_bfloat16, 0, 8, false>"
lib_src = jit.source("activation.cu")
variants_src = {
    "lib_fresh": lib_src,
    "lib_nolb": lib_src.replace("__launch_bounds__(kActMaxBlockSize)", ""),
    "lib_notail": lib_src.replace("} else if constexpr (kVecWidth > 1) {", "} else if constexpr (false) {"),
}
assert variants_src["lib_nolb"] != lib_src and variants_src["lib_notail"] != lib_src
lib_kernels = {k: cp.RawModule(code=s, options=jit.COMPILE_OPTIONS, name_expressions=[EXPR]).get_function(EXPR)
               for k, s in variants_src.items()}
from cupykern.ops.activation import ACT_AND_MUL
lib_kernels["lib_bare"] = jit.get_kernel(ACT_AND_MUL, "__nv_bfloat16", 0, 8, False)  # the launcher's own kernel

# Triton's cubins (tc_dump.py): silu kernels only (pointwise, in_ptr0, out_ptr0, xnumel).
triton = {}
for js in glob.glob(os.path.join(sys.argv[1], "*", "*.json")):
    meta = json.load(open(js))
    name = meta.get("name", "")
    if "silu" not in name:
        continue
    base = js[:-5]
    ptx = open(base + ".ptx").read()
    ttir = open(base + ".ttir").read()
    xblock = max(int(v) for v in re.findall(r"end = (\d+) : i32", ttir))
    params = re.findall(r"\.param \.(u64|u32|b64|b32)", ptx.split(".entry")[1].split(")")[0])
    fn = cp.RawModule(path=base + ".cubin").get_function(name)
    triton[base] = dict(fn=fn, meta=meta, xblock=xblock, params=params)
    print("triton", name, "xblock", xblock, "warps", meta.get("num_warps"), "shared", meta.get("shared"), "params", params,
          "attrs", fn.attributes, flush=True)

res = []
def t(case, fn, rnd):
    us = time_graph(fn).median_us
    res.append({"round": rnd, "case": case, "us": round(us, 3)})
    print(json.dumps(res[-1]), flush=True)

rng = np.random.default_rng(0)
for name, k in [("h_min", hand.get_function("h_min")), ("h_p64_tail", hand.get_function("h_p64_tail"))] + \
        [(n, f) for n, f in lib_kernels.items() ]:
    print("attrs", name, k.attributes, flush=True)
for rnd in (0, 1):
    for d, n in ((14336, 1), (14336, 16), (14336, 64), (28672, 1), (28672, 16)):
        x = cp.asarray(rng.standard_normal((n, 2 * d)).astype(bf))
        ref = cupykern.silu_and_mul(x)
        out = cp.empty((n, d), bf)
        up = x[:, d:]
        i32, i64 = np.int32, np.int64
        g128 = (-(-d // 8 // 128), n)
        tag = f"d{d} n{n}"
        cases = {
            "lib": lambda: cupykern.silu_and_mul(x, out=out),
            "h_min": lambda f=hand.get_function("h_min"): f(g128, (128,), (out, x, up, i32(d), i32(2 * d))),
            "h_min_e4_b256": lambda f=hand.get_function("h_min_e4"): f((-(-d // 4 // 256), n), (256,), (out, x, up, i32(d), i32(2 * d))),
            "h_lb1024": lambda f=hand.get_function("h_lb1024"): f(g128, (128,), (out, x, up, i32(d), i32(2 * d))),
            "h_lb128": lambda f=hand.get_function("h_lb128"): f(g128, (128,), (out, x, up, i32(d), i32(2 * d))),
            "h_p64": lambda f=hand.get_function("h_p64"): f(g128, (128,), (out, x, up, i64(n), i64(d), i64(2 * d), i64(2 * d), i64(d))),
            "h_p64_tail": lambda f=hand.get_function("h_p64_tail"): f(g128, (128,), (out, x, up, i64(n), i64(d), i64(2 * d), i64(2 * d), i64(d))),
        }
        for vn, f in lib_kernels.items():
            cases[vn] = lambda f=f: f(g128, (128,), (out, x, up, i64(n), i64(d), i64(2 * d), i64(2 * d), i64(d)))
        if n == 1:
            for base, tk in triton.items():
                xb = tk["xblock"]
                if str(d) not in open(base + ".ttir").read():
                    continue
                args = [x, out, i32(d)] + [np.uint64(0)] * (len(tk["params"]) - 3)
                cases[f"triton_xb{xb}_w{tk['meta']['num_warps']}"] = (
                    lambda f=tk["fn"], xb=xb, args=tuple(args), w=tk["meta"]["num_warps"], sh=tk["meta"].get("shared", 0):
                    f((-(-d // xb),), (32 * w,), args, shared_mem=sh))
        order = list(cases) if rnd == 0 else list(reversed(cases))
        for c in order:
            out.fill(np.nan)
            cases[c]()
            ok = bool(cp.array_equal(out, ref))
            if not ok:
                print("MISMATCH", c, tag, flush=True)
            t(f"{c} {tag}", cases[c], rnd)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "bisect.json"), "w"), indent=1)
