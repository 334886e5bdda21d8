"""Decode-size floors: hand-written minimal kernels against the library, graph replay."""
import json, os, sys
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern.timing import time_graph

SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
struct __align__(16) V8 { T e[8]; };
extern "C" __global__ void copy2d(T* out, const T* gate, const T* up, int d, int stride) {
  int slot = blockIdx.x * blockDim.x + threadIdx.x; int row = blockIdx.y;
  if (slot * 8 >= d) return;
  V8 g = *(const V8*)(gate + (long long)row * stride + slot * 8);
  V8 u = *(const V8*)(up + (long long)row * stride + slot * 8);
  V8 o; for (int i = 0; i < 8; ++i) o.e[i] = __float2bfloat16(__bfloat162float(g.e[i]) + __bfloat162float(u.e[i]));
  *(V8*)(out + (long long)row * d + slot * 8) = o;
}
extern "C" __global__ void silu2d(T* out, const T* gate, const T* up, int d, int stride) {
  int slot = blockIdx.x * blockDim.x + threadIdx.x; int row = blockIdx.y;
  if (slot * 8 >= d) return;
  V8 g = *(const V8*)(gate + (long long)row * stride + slot * 8);
  V8 u = *(const V8*)(up + (long long)row * stride + slot * 8);
  V8 o;
  for (int i = 0; i < 8; ++i) { float x = __bfloat162float(g.e[i]);
    float y = __fdividef(x, 1.0f + __expf(-x)); y = x == -__int_as_float(0x7f800000) ? -0.0f : y;
    o.e[i] = __float2bfloat16(y * __bfloat162float(u.e[i])); }
  *(V8*)(out + (long long)row * d + slot * 8) = o;
}
// rms_norm: 1 row per block, kThreads threads, 2 leaves a thread, warp-first reduction.
template <int kThreads>
__device__ void rms(T* out, const T* x, const T* w, int n, float eps) {
  __shared__ float red[32];
  const T* xr = x + (long long)blockIdx.x * n; T* orow = out + (long long)blockIdx.x * n;
  int t = threadIdx.x;
  V8 a0 = *(const V8*)(xr + t * 8), a1 = *(const V8*)(xr + (t + kThreads) * 8);
  V8 w0 = *(const V8*)(w + t * 8), w1 = *(const V8*)(w + (t + kThreads) * 8);
  float s = 0.f;
  for (int i = 0; i < 8; ++i) { float v = __bfloat162float(a0.e[i]); s = fmaf(v, v, s); }
  for (int i = 0; i < 8; ++i) { float v = __bfloat162float(a1.e[i]); s = fmaf(v, v, s); }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
  if ((t & 31) == 0) red[t >> 5] = s;
  __syncthreads();
  float r = (t & 31) < kThreads / 32 ? red[t & 31] : 0.f;
  for (int o = kThreads / 64; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffff, r, o);
  float inv = rsqrtf(r / n + eps);
  V8 o0, o1;
  for (int i = 0; i < 8; ++i) o0.e[i] = __float2bfloat16(__bfloat162float(a0.e[i]) * inv * __bfloat162float(w0.e[i]));
  for (int i = 0; i < 8; ++i) o1.e[i] = __float2bfloat16(__bfloat162float(a1.e[i]) * inv * __bfloat162float(w1.e[i]));
  *(V8*)(orow + t * 8) = o0; *(V8*)(orow + (t + kThreads) * 8) = o1;
}
extern "C" __global__ void rms256(T* out, const T* x, const T* w, int n, float eps) { rms<256>(out, x, w, n, eps); }
extern "C" __global__ void rms512(T* out, const T* x, const T* w, int n, float eps) { rms<512>(out, x, w, n, eps); }
'''
mod = cp.RawModule(code=SRC, options=("-std=c++17",))
res = {}
bf = ml_dtypes.bfloat16
rng = np.random.default_rng(0)
def t(name, fn):
    tm = time_graph(fn, replays=30)
    res[name] = tm.median_us
    print(f"{name:40s} {tm.median_us:6.2f} us", flush=True)

for d in (14336, 28672):
    for rows in (1, 16, 64):
        x = cp.asarray(rng.standard_normal((rows, 2 * d)).astype(bf))
        out = cp.empty((rows, d), dtype=x.dtype)
        for bs in (64, 128):
            gx = -(-d // 8 // bs)
            for k in ("copy2d", "silu2d"):
                f = mod.get_function(k)
                t(f"{k} d{d} r{rows} b{bs}", lambda: f((gx, rows), (bs,), (out, x, x[:, d:], np.int32(d), np.int32(2 * d))))
        t(f"lib silu d{d} r{rows}", lambda: cupykern.silu_and_mul(x, out=out))
        t(f"lib gelu d{d} r{rows}", lambda: cupykern.gelu_and_mul(x, out=out))
for n, k in ((4096, "rms256"), (8192, "rms512")):
    for rows in (1, 16, 64):
        x = cp.asarray(rng.standard_normal((rows, n)).astype(bf)); w = cp.asarray(rng.standard_normal(n).astype(bf))
        out = cp.empty_like(x)
        f = mod.get_function(k)
        t(f"{k} n{n} r{rows}", lambda: f((rows,), (n // 16,), (out, x, w, np.int32(n), np.float32(1e-6))))
        t(f"lib rms_norm n{n} r{rows}", lambda: cupykern.rms_norm(x, w, 1e-6, out=out))
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "floor.json"), "w"), indent=1)
