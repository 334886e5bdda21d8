"""Isolating the decode overhead of the library kernels: variants of minimal kernels, graph replay."""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np, ml_dtypes
import cupykern
from cupykern.timing import time_graph

SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
typedef long long i64;
struct __align__(16) V8 { T e[8]; };
__device__ __forceinline__ V8 silu8(V8 g, V8 u) {
  V8 o;
  for (int i = 0; i < 8; ++i) { float x = __bfloat162float(g.e[i]);
    float y = __fdividef(x, 1.0f + __expf(-x)); y = x == -__int_as_float(0x7f800000) ? -0.0f : y;
    o.e[i] = __float2bfloat16(y * __bfloat162float(u.e[i])); }
  return o;
}
extern "C" __global__ void s0(T* out, const T* gate, const T* up, int d, int stride) {
  int slot = blockIdx.x * blockDim.x + threadIdx.x; int row = blockIdx.y;
  if (slot * 8 >= d) return;
  *(V8*)(out + (i64)row * d + slot * 8) = silu8(*(const V8*)(gate + (i64)row * stride + slot * 8), *(const V8*)(up + (i64)row * stride + slot * 8));
}
// S1: lib's parameters, 64-bit index math, 2-D grid, grid-stride loops in both dims.
extern "C" __global__ void s1(T* out, const T* gate, const T* up, i64 num_rows, i64 d, i64 gs, i64 us, i64 os) {
  const i64 slots = (d + 7) / 8;
  for (i64 row = blockIdx.y; row < num_rows; row += gridDim.y)
    for (i64 slot = (i64)blockIdx.x * blockDim.x + threadIdx.x; slot < slots; slot += (i64)gridDim.x * blockDim.x) {
      const i64 i = slot * 8;
      if (i + 8 <= d) *(V8*)(out + row * os + i) = silu8(*(const V8*)(gate + row * gs + i), *(const V8*)(up + row * us + i));
    }
}
// S2: lib's 1-D walk with the divisions (as gated_rows.cuh).
extern "C" __global__ void s2(T* out, const T* gate, const T* up, i64 num_rows, i64 d, i64 gs, i64 us, i64 os) {
  const i64 slots_per_row = (d + 7) / 8;
  const i64 chunks_per_row = (slots_per_row + blockDim.x - 1) / blockDim.x;
  const i64 num_chunks = num_rows * chunks_per_row;
  i64 row = blockIdx.x / chunks_per_row;
  i64 chunk = blockIdx.x - row * chunks_per_row;
  const i64 step_rows = gridDim.x / chunks_per_row;
  const i64 step_chunks = gridDim.x - step_rows * chunks_per_row;
  for (i64 work = blockIdx.x; work < num_chunks; work += gridDim.x) {
    const i64 slot = chunk * blockDim.x + threadIdx.x;
    if (slot < slots_per_row) {
      const i64 i = slot * 8;
      if (i + 8 <= d) *(V8*)(out + row * os + i) = silu8(*(const V8*)(gate + row * gs + i), *(const V8*)(up + row * us + i));
    }
    row += step_rows; chunk += step_chunks;
    if (chunk >= chunks_per_row) { chunk -= chunks_per_row; ++row; }
  }
}
// rms_norm variants: 1 row per block, kThreads threads, 2 leaves a thread.
template <int kThreads, int kVariant>
__device__ void rms(T* out, const T* x, const T* w, int n, float eps) {
  __shared__ float red[kThreads];
  const T* xr = x + (i64)blockIdx.x * n; T* orow = out + (i64)blockIdx.x * n;
  int t = threadIdx.x;
  V8 a0 = *(const V8*)(xr + t * 8), a1 = *(const V8*)(xr + (t + kThreads) * 8);
  V8 w0 = *(const V8*)(w + t * 8), w1 = *(const V8*)(w + (t + kThreads) * 8);
  float s0 = -0.f, s1 = -0.f;
  for (int i = 0; i < 8; ++i) { float v = __bfloat162float(a0.e[i]); s0 = fmaf(v, v, s0); }
  for (int i = 0; i < 8; ++i) { float v = __bfloat162float(a1.e[i]); s1 = fmaf(v, v, s1); }
  float s = s0 + s1, r;
  if (kVariant == 2 || kVariant == 3) {  // lib's tree: all lanes to smem, halving over warps, then butterfly
    red[t] = s; __syncthreads();
    float acc[kThreads / 32];
    for (int j = 0; j < kThreads / 32; ++j) acc[j] = red[j * 32 + (t & 31)];
    for (int h = kThreads / 64; h > 0; h >>= 1) for (int j = 0; j < h; ++j) acc[j] += acc[j + h];
    r = acc[0];
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffff, r, o);
    if (kVariant == 3) __syncthreads();
  } else {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if ((t & 31) == 0) red[t >> 5] = s;
    __syncthreads();
    r = (t & 31) < kThreads / 32 ? red[t & 31] : 0.f;
    for (int o = kThreads / 64; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffff, r, o);
    if (kVariant == 1) __syncthreads();
  }
  float inv = rsqrtf(r / n + eps);
  V8 o0, o1;
  for (int i = 0; i < 8; ++i) o0.e[i] = __float2bfloat16(__bfloat162float(a0.e[i]) * inv * __bfloat162float(w0.e[i]));
  for (int i = 0; i < 8; ++i) o1.e[i] = __float2bfloat16(__bfloat162float(a1.e[i]) * inv * __bfloat162float(w1.e[i]));
  *(V8*)(orow + t * 8) = o0; *(V8*)(orow + (t + kThreads) * 8) = o1;
}
extern "C" __global__ void r0(T* out, const T* x, const T* w, int n, float eps) { rms<256, 0>(out, x, w, n, eps); }
extern "C" __global__ void r1(T* out, const T* x, const T* w, int n, float eps) { rms<256, 1>(out, x, w, n, eps); }
extern "C" __global__ void r2(T* out, const T* x, const T* w, int n, float eps) { rms<256, 2>(out, x, w, n, eps); }
extern "C" __global__ void r3(T* out, const T* x, const T* w, int n, float eps) { rms<256, 3>(out, x, w, n, eps); }
// r4: r0 with the library's parameter list (9, 64-bit sizes and strides).
extern "C" __global__ void r4(T* out, const T* x, const T* w, i64 num_rows, i64 n, i64 xs, i64 os, float eps, float off) {
  rms<256, 0>(out, x, w, (int)n, eps);
}
'''
mod = cp.RawModule(code=SRC, options=("--std=c++17",))
res = {}
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
def t(name, fn):
    tm = time_graph(fn, replays=30)
    res[name] = tm.median_us
    print(f"{name:40s} {tm.median_us:6.2f} us", flush=True)
i64 = np.int64
for d, rows in ((14336, 1), (28672, 1), (28672, 16)):
    x = cp.asarray(rng.standard_normal((rows, 2 * d)).astype(bf))
    out = cp.empty((rows, d), dtype=x.dtype)
    bs = 128; gx = -(-d // 8 // bs)
    f0, f1, f2 = (mod.get_function(k) for k in ("s0", "s1", "s2"))
    for rep in range(2):
        t(f"s0 d{d} r{rows} #{rep}", lambda: f0((gx, rows), (bs,), (out, x, x[:, d:], np.int32(d), np.int32(2 * d))))
        t(f"s1 d{d} r{rows} #{rep}", lambda: f1((gx, rows), (bs,), (out, x, x[:, d:], i64(rows), i64(d), i64(2 * d), i64(2 * d), i64(d))))
        t(f"s2 d{d} r{rows} #{rep}", lambda: f2((gx * rows,), (bs,), (out, x, x[:, d:], i64(rows), i64(d), i64(2 * d), i64(2 * d), i64(d))))
        t(f"lib silu d{d} r{rows} #{rep}", lambda: cupykern.silu_and_mul(x, out=out))
for rows in (1, 64):
    n = 4096
    x = cp.asarray(rng.standard_normal((rows, n)).astype(bf)); w = cp.asarray(rng.standard_normal(n).astype(bf))
    out = cp.empty_like(x)
    for rep in range(2):
        for k in ("r0", "r1", "r2", "r3"):
            f = mod.get_function(k)
            t(f"{k} n{n} r{rows} #{rep}", lambda: f((rows,), (256,), (out, x, w, np.int32(n), np.float32(1e-6))))
        f = mod.get_function("r4")
        t(f"r4 n{n} r{rows} #{rep}", lambda: f((rows,), (256,), (out, x, w, i64(rows), i64(n), i64(n), i64(n), np.float32(1e-6), np.float32(0))))
        t(f"lib rms_norm n{n} r{rows} #{rep}", lambda: cupykern.rms_norm(x, w, 1e-6, out=out))
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "iso.json"), "w"), indent=1)
