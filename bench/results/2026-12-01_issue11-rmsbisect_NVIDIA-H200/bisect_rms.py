"""rms_norm at decode sizes: a minimal hand-written kernel of the library's layout (one row a
block, kThreads threads, two 16-byte leaves a thread), changed one step at a time toward the
library's (torch-free, CUDA-graph replay; NOTES item 21):
  A  warp-first reduction (shuffles, one float a warp through shared memory, shuffles)
  B  the library's fixed tree: every thread's partial through shared memory, the halving
     over warps first (kThreads / 32 loads a thread), then the shuffles
  C  B with the library's arithmetic (weight_offset, __fmul_rn / __fadd_rn, eps after the
     division) and 32-bit parameters as the library passes them
  D  C inside the library's row loop (for base ...; active test)
  lib  cupykern.rms_norm
Two rounds in opposite orders."""
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
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17",))
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
            "A": lambda f=mod.get_function(f"A{k}"), x=x, w=w, out=out, rows=rows, n=n, k=k:
                f((rows,), (k,), (out, x, w, i32(n), np.float32(1e-6))),
            "B": lambda f=mod.get_function(f"B{k}"), x=x, w=w, out=out, rows=rows, n=n, k=k:
                f((rows,), (k,), (out, x, w, i32(n), np.float32(1e-6))),
            "C": lambda f=mod.get_function(f"C{k}"), x=x, w=w, out=out, rows=rows, n=n, k=k:
                f((rows,), (k,), (out, x, w, i32(rows), i32(n), i32(n), i32(n), np.float32(1e-6), np.float32(0))),
            "D": lambda f=mod.get_function(f"D{k}"), x=x, w=w, out=out, rows=rows, n=n, k=k:
                f((rows,), (k,), (out, x, w, i32(rows), i32(n), i32(n), i32(n), np.float32(1e-6), np.float32(0))),
            "lib": lambda x=x, w=w, out=out: cupykern.rms_norm(x, w, 1e-6, out=out),
        }
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
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "bisect_rms.json"), "w"), indent=1)
