"""rms_norm at decode sizes, second bisect (NOTES item 22): from step D of bisect_rms.py (the
hand-written kernel with the library's tree, arithmetic and row loop) toward the library's
exact-walk kernel one piece at a time, with the library's own device code (kernels_cu):
  D2  D rebuilt on the library's Vec / load_vec (must time as D)
  E   D2 with the weights through `pinned` (generic loads), requested before the row's x
  F   D2 with the library's row_tree_reduce over two register columns and a ScratchPair
  G   D2 storing through store_rounded
  H   E + F + G
  lib cupykern.rms_norm (kExact since ee32a24)
Two rounds in opposite orders; every step is checked bit for bit against the library."""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern.timing import time_graph

SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
struct __align__(16) V8 { T e[8]; };
__device__ __forceinline__ float sq8(const V8& a, float s) {
  for (int i = 0; i < 8; ++i) { float v = __bfloat162float(a.e[i]); s = __fmaf_rn(v, v, s); }
  return s;
}
template <int K>
__device__ __forceinline__ float reduce_warp_first(float s, float* red) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  const int t = threadIdx.x;
  if ((t & 31) == 0) red[t >> 5] = s;
  __syncthreads();
  float r = (t & 31) < K / 32 ? red[t & 31] : 0.f;
  for (int o = K / 64; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffff, r, o);
  return r;
}
template <int kCount, int kHalf>
__device__ __forceinline__ float halving(const float* s, int j) {
  if constexpr (kHalf == kCount) return s[j * 32];
  else return halving<kCount, 2 * kHalf>(s, j) + halving<kCount, 2 * kHalf>(s, j + kHalf);
}
template <int K>
__device__ __forceinline__ float reduce_tree(float s, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = s;
  __syncthreads();
  float v = halving<K / 32, 1>(scratch + (t & 31), 0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
template <int K, bool kTree, bool kLibMath>
__device__ __forceinline__ void row(T* out, const T* x, const T* w, int n, float eps, float off, long long r) {
  __shared__ float scratch[K];
  const T* xr = x + r * n; T* orow = out + r * n;
  const int t = threadIdx.x;
  V8 a0 = *(const V8*)(xr + t * 8), a1 = *(const V8*)(xr + (t + K) * 8);
  V8 w0 = *(const V8*)(w + t * 8), w1 = *(const V8*)(w + (t + K) * 8);
  float s = kTree ? sq8(a0, 0.f) + sq8(a1, 0.f) : sq8(a1, sq8(a0, 0.f));
  s = kTree ? reduce_tree<K>(s, scratch) : reduce_warp_first<K>(s, scratch);
  const float inv = kLibMath ? rsqrtf(s / static_cast<float>(n) + eps) : rsqrtf(s / n + eps);
  V8 o0, o1;
  for (int i = 0; i < 8; ++i) {
    if (kLibMath) {
      o0.e[i] = __float2bfloat16(__fmul_rn(__fmul_rn(__bfloat162float(a0.e[i]), inv), __fadd_rn(__bfloat162float(w0.e[i]), off)));
      o1.e[i] = __float2bfloat16(__fmul_rn(__fmul_rn(__bfloat162float(a1.e[i]), inv), __fadd_rn(__bfloat162float(w1.e[i]), off)));
    } else {
      o0.e[i] = __float2bfloat16(__bfloat162float(a0.e[i]) * inv * __bfloat162float(w0.e[i]));
      o1.e[i] = __float2bfloat16(__bfloat162float(a1.e[i]) * inv * __bfloat162float(w1.e[i]));
    }
  }
  *(V8*)(orow + t * 8) = o0; *(V8*)(orow + (t + K) * 8) = o1;
}
#define KERNELS(K) \
extern "C" __global__ void __launch_bounds__(1024) A##K(T* out, const T* x, const T* w, int n, float eps) { row<K, false, false>(out, x, w, n, eps, 0.f, blockIdx.x); } \
extern "C" __global__ void __launch_bounds__(1024) B##K(T* out, const T* x, const T* w, int n, float eps) { row<K, true, false>(out, x, w, n, eps, 0.f, blockIdx.x); } \
extern "C" __global__ void __launch_bounds__(1024) C##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row<K, true, true>(out, x, w, n, eps, off, blockIdx.x); } \
extern "C" __global__ void __launch_bounds__(1024) D##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { \
  for (long long base = blockIdx.x; base < rows; base += gridDim.x) { row<K, true, true>(out, x, w, n, eps, off, base); } }
KERNELS(256)
KERNELS(512)

#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
template <int K, bool kPinnedW, bool kLibReduce, bool kLibStore, int kF>
__device__ __forceinline__ void row2(T* out, const T* x, const T* w, int n, float eps, float off, long long r,
                                     float* scratch, cupykern::ScratchPair<kF>& pair) {
  using LV = cupykern::Vec<T, 8>;
  const int t = threadIdx.x;
  LV w0, w1;
  if (kPinnedW) {
    const T* wp = cupykern::pinned(w);
    w0 = cupykern::load_vec<T, 8>(wp + t * 8); w1 = cupykern::load_vec<T, 8>(wp + (t + K) * 8);
  }
  const T* xr = x + r * n; T* orow = out + r * n;
  const LV a0 = cupykern::load_vec<T, 8>(xr + t * 8), a1 = cupykern::load_vec<T, 8>(xr + (t + K) * 8);
  if (!kPinnedW) { w0 = cupykern::load_vec<T, 8>(w + t * 8); w1 = cupykern::load_vec<T, 8>(w + (t + K) * 8); }
  float col[2] = {0.f, 0.f};
  for (int i = 0; i < 8; ++i) {
    const float v0 = cupykern::to_float(a0.elt[i]), v1 = cupykern::to_float(a1.elt[i]);
    col[0] = __fmaf_rn(v0, v0, col[0]); col[1] = __fmaf_rn(v1, v1, col[1]);
  }
  float s;
  if constexpr (kLibReduce) s = cupykern::row_tree_reduce<cupykern::SumOp, K, 2, 32>(col, pair);
  else s = reduce_tree<K>(col[0] + col[1], scratch);
  const float inv = rsqrtf(s / static_cast<float>(n) + eps);
  float y0[8], y1[8];
  for (int i = 0; i < 8; ++i) {
    y0[i] = __fmul_rn(__fmul_rn(cupykern::to_float(a0.elt[i]), inv), __fadd_rn(cupykern::to_float(w0.elt[i]), off));
    y1[i] = __fmul_rn(__fmul_rn(cupykern::to_float(a1.elt[i]), inv), __fadd_rn(cupykern::to_float(w1.elt[i]), off));
  }
  if constexpr (kLibStore) {
    cupykern::store_rounded<T, 8>(orow + t * 8, y0); cupykern::store_rounded<T, 8>(orow + (t + K) * 8, y1);
  } else {
    V8 o0, o1;
    for (int i = 0; i < 8; ++i) { o0.e[i] = __float2bfloat16(y0[i]); o1.e[i] = __float2bfloat16(y1[i]); }
    *(V8*)(orow + t * 8) = o0; *(V8*)(orow + (t + K) * 8) = o1;
  }
}
template <int K, bool P, bool R, bool S>
__device__ __forceinline__ void row2_loop(T* out, const T* x, const T* w, int rows, int n, float eps, float off) {
  constexpr int kF = cupykern::tree_scratch_floats<K, 1024>();
  __shared__ float sc[2 * kF];
  cupykern::ScratchPair<kF> pair(sc);
  for (long long base = blockIdx.x; base < rows; base += gridDim.x) row2<K, P, R, S, kF>(out, x, w, n, eps, off, base, sc, pair);
}
#define KERNELS2(K) \
extern "C" __global__ void __launch_bounds__(1024) D2##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row2_loop<K, false, false, false>(out, x, w, rows, n, eps, off); } \
extern "C" __global__ void __launch_bounds__(1024) E##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row2_loop<K, true, false, false>(out, x, w, rows, n, eps, off); } \
extern "C" __global__ void __launch_bounds__(1024) F##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row2_loop<K, false, true, false>(out, x, w, rows, n, eps, off); } \
extern "C" __global__ void __launch_bounds__(1024) G##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row2_loop<K, false, false, true>(out, x, w, rows, n, eps, off); } \
extern "C" __global__ void __launch_bounds__(1024) H##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { row2_loop<K, true, true, true>(out, x, w, rows, n, eps, off); }
KERNELS2(256)
KERNELS2(512)
'''
KERNELS_CU = os.path.join(os.path.dirname(cupykern.__file__), os.pardir, "kernels_cu")
# The library's NVRTC options (cupykern/jit.py): -ftz=true and device functions by default.
mod = cp.RawModule(code=SRC, options=("-std=c++17", "-ftz=true", "--device-as-default-execution-space",
                                      "-I" + os.path.abspath(KERNELS_CU)))
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
res = {}


def t(name, fn):
    tm = time_graph(fn, replays=30)
    res.setdefault(name, []).append(tm.median_us)
    print(f"{name:28s} {tm.median_us:6.3f} us", flush=True)


cases = []
for n, k in ((4096, 256), (8192, 512)):
    for rows in (1, 16, 64):
        x = cp.asarray(rng.standard_normal((rows, n)).astype(bf))
        w = cp.asarray(rng.standard_normal(n).astype(bf))
        out = cp.empty_like(x)
        ref = cupykern.rms_norm(x, w, 1e-6)
        i32 = np.int32
        steps = {
            name: (lambda f=mod.get_function(f"{name}{k}"), x=x, w=w, out=out, rows=rows, n=n, k=k:
                   f((rows,), (k,), (out, x, w, i32(rows), i32(n), i32(n), i32(n), np.float32(1e-6), np.float32(0))))
            for name in ("D", "D2", "E", "F", "G", "H")
        }
        steps["lib"] = lambda x=x, w=w, out=out: cupykern.rms_norm(x, w, 1e-6, out=out)
        for name, fn in steps.items():  # each hand-written step against the library's bits
            out.fill(0)
            fn()
            diff = float(cp.abs(out.astype(cp.float32) - ref.astype(cp.float32)).max())
            print(f"n{n} r{rows} {name}: max |diff| vs library {diff:.3g}", flush=True)
        cases.append((f"n{n} r{rows}", steps))
for order in (1, -1):
    for label, steps in cases:
        for name, fn in list(steps.items())[::order]:
            t(f"{label} {name}", fn)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "bisect_rms2.json"), "w"), indent=1)
