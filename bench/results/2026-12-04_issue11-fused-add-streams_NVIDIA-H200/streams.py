"""Is the fused add's gap to a copy of its own bytes (94 % at 4096 tokens, NOTES item 37)
the kernel's (its row reduction and barrier before the second store) or the access
pattern's (two streams read, the same two written)? NOTES item 38, call A.

Times, cold L2 (cupykern.timing.time_cold, medians), bf16 rows of 4096 (llama-3.1-8b) and
8192 (-70b) elements at 4096 and 16384 rows, three rounds in rotating order:
  lib        cupykern.fused_add_rms_norm (the library, in place)
  fused      a stand-alone fused add + RMSNorm in the library's decode layout (one row a
             block, 2 leaves of 16 bytes a thread, every load before the add)
  fused_cs   the same, both stores st.global.cs (streaming)
  fused_ldcs the same, the four loads ld.global.cs
  fused_pipe persistent blocks (a full SM's threads, rows grid-stride): the next row's
             x and residual requested before this row's reduction
  stream4    fused without the reduction: the same loads, stores and layout, no barrier
  stream4_gs stream4 as a flat grid-stride walk, 4 leaves a thread an iteration
  copy_same  cudaMemcpy of the same bytes (each direction 2 x rows x hidden x 2 bytes)
  copy_kern  a 16-byte vector copy kernel over the same bytes
Prints GB/s by the minimal byte count (4 x rows x hidden x 2) and % of copy_same.
"""
import json
import os
import sys

import cupy
import numpy as np

import cupykern
from cupykern import timing

SRC = r"""
#include <cuda_bf16.h>
__device__ __forceinline__ uint4 ld(const uint4* p, int hint) {
  uint4 v;
  if (hint == 1) {
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    v = *p;
  }
  return v;
}
__device__ __forceinline__ void st(uint4* p, uint4 v, int hint) {
  if (hint == 1) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
  } else {
    *p = v;
  }
}
__device__ __forceinline__ float lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ unsigned pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ void unpack(uint4 v, float* f) {
  f[0] = lo(v.x); f[1] = hi(v.x); f[2] = lo(v.y); f[3] = hi(v.y);
  f[4] = lo(v.z); f[5] = hi(v.z); f[6] = lo(v.w); f[7] = hi(v.w);
}
__device__ __forceinline__ uint4 repack(const float* f) {
  return make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
}

template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  constexpr int kWarps = kThreads / 32;
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = (threadIdx.x & 31) < kWarps ? smem[threadIdx.x & 31] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// One row a block; 2 leaves a thread (leaf l*kThreads + tid). kReduce false: no norm.
template <int kThreads, bool kReduce, int kLdHint, int kStHint>
__global__ void __launch_bounds__(kThreads) rowblock(uint4* x, uint4* r, const uint4* __restrict__ w,
                                                     int rows, float eps) {
  constexpr int H8 = kThreads * 2;  // leaves a row
  __shared__ float smem[32];
  const long long row = blockIdx.x;
  uint4* xr = x + row * H8;
  uint4* rr = r + row * H8;
  uint4 a[2], b[2], wv[2];
#pragma unroll
  for (int l = 0; l < 2; ++l) { a[l] = ld(xr + l * kThreads + threadIdx.x, kLdHint); b[l] = ld(rr + l * kThreads + threadIdx.x, kLdHint); }
#pragma unroll
  for (int l = 0; l < 2; ++l) wv[l] = w[l * kThreads + threadIdx.x];
  float s[2][8], ss = 0.f;
#pragma unroll
  for (int l = 0; l < 2; ++l) {
    float fa[8], fb[8];
    unpack(a[l], fa); unpack(b[l], fb);
#pragma unroll
    for (int e = 0; e < 8; ++e) s[l][e] = fa[e] + fb[e];
    uint4 packed = repack(s[l]);
    unpack(packed, s[l]);
    st(rr + l * kThreads + threadIdx.x, packed, kStHint);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(s[l][e], s[l][e], ss);
  }
  float inv = 1.f;
  if (kReduce) inv = rsqrtf(block_sum<kThreads>(ss, smem) / (H8 * 8) + eps);
#pragma unroll
  for (int l = 0; l < 2; ++l) {
    float fw[8], y[8];
    unpack(wv[l], fw);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = s[l][e] * inv * fw[e];
    st(xr + l * kThreads + threadIdx.x, repack(y), kStHint);
  }
}

// Persistent blocks: rows blockIdx.x, + gridDim.x, ...; the next row's loads are issued
// before this row's reduction.
template <int kThreads>
__global__ void __launch_bounds__(kThreads) pipelined(uint4* x, uint4* r, const uint4* __restrict__ w,
                                                      int rows, float eps) {
  constexpr int H8 = kThreads * 2;
  __shared__ float smem[2][32];
  uint4 wv[2];
#pragma unroll
  for (int l = 0; l < 2; ++l) wv[l] = w[l * kThreads + threadIdx.x];
  long long row = blockIdx.x;
  uint4 a[2], b[2];
  if (row < rows) {
#pragma unroll
    for (int l = 0; l < 2; ++l) { a[l] = x[row * H8 + l * kThreads + threadIdx.x]; b[l] = r[row * H8 + l * kThreads + threadIdx.x]; }
  }
  int parity = 0;
  for (; row < rows; row += gridDim.x, parity ^= 1) {
    uint4* xr = x + row * H8;
    uint4* rr = r + row * H8;
    float s[2][8], ss = 0.f;
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      float fa[8], fb[8];
      unpack(a[l], fa); unpack(b[l], fb);
#pragma unroll
      for (int e = 0; e < 8; ++e) s[l][e] = fa[e] + fb[e];
      uint4 packed = repack(s[l]);
      unpack(packed, s[l]);
      rr[l * kThreads + threadIdx.x] = packed;
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = fmaf(s[l][e], s[l][e], ss);
    }
    const long long next = row + gridDim.x;
    if (next < rows) {
#pragma unroll
      for (int l = 0; l < 2; ++l) { a[l] = x[next * H8 + l * kThreads + threadIdx.x]; b[l] = r[next * H8 + l * kThreads + threadIdx.x]; }
    }
    // Two scratch rows by parity: the next row's writes cannot race this row's reads.
    float v = ss;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) smem[parity][threadIdx.x >> 5] = v;
    __syncthreads();
    float t = (threadIdx.x & 31) < kThreads / 32 ? smem[parity][threadIdx.x & 31] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    const float inv = rsqrtf(t / (H8 * 8) + eps);
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      float fw[8], y[8];
      unpack(wv[l], fw);
#pragma unroll
      for (int e = 0; e < 8; ++e) y[e] = s[l][e] * inv * fw[e];
      xr[l * kThreads + threadIdx.x] = repack(y);
    }
  }
}

// Flat grid-stride walk over n leaves, 4 a thread an iteration; weight leaf i % h8.
__global__ void stream4_gs(uint4* x, uint4* r, const uint4* __restrict__ w, long long n, int h8) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * step) {
    uint4 a[4], b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) if (i + k * step < n) { a[k] = x[i + k * step]; b[k] = r[i + k * step]; }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const long long j = i + k * step;
      if (j >= n) break;
      float fa[8], fb[8], fw[8];
      unpack(a[k], fa); unpack(b[k], fb); unpack(w[j % h8], fw);
#pragma unroll
      for (int e = 0; e < 8; ++e) fa[e] = fa[e] + fb[e];
      r[j] = repack(fa);
#pragma unroll
      for (int e = 0; e < 8; ++e) fa[e] *= fw[e];
      x[j] = repack(fa);
    }
  }
}

__global__ void copy_kern(uint4* dst, const uint4* __restrict__ src, long long n) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 4 * step) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) if (i + k * step < n) v[k] = src[i + k * step];
#pragma unroll
    for (int k = 0; k < 4; ++k) if (i + k * step < n) dst[i + k * step] = v[k];
  }
}
"""

NAMES = []
for t in (256, 512):
    NAMES += [f"rowblock<{t}, true, 0, 0>", f"rowblock<{t}, true, 0, 1>", f"rowblock<{t}, true, 1, 0>",
              f"rowblock<{t}, false, 0, 0>", f"pipelined<{t}>"]
mod = cupy.RawModule(code=SRC, options=("-std=c++17",), name_expressions=NAMES + ["stream4_gs", "copy_kern"])
sm = cupy.cuda.Device().attributes["MultiProcessorCount"]
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "sm_count": sm, "points": []}


def make(rows, hidden):
    x32 = rng.standard_normal((rows, hidden), dtype=np.float32)
    r32 = rng.standard_normal((rows, hidden), dtype=np.float32)
    w32 = rng.standard_normal(hidden, dtype=np.float32)
    return tuple(cupy.asarray(a.astype(cupykern.bfloat16)) for a in (x32, r32, w32))


for rows, hidden in ((4096, 4096), (4096, 8192), (16384, 4096), (16384, 8192)):
    x0, r0, w = make(rows, hidden)
    x, r = x0.copy(), r0.copy()
    threads = hidden // 16
    nleaf = rows * hidden // 8
    eps = np.float32(1e-6)
    fns = {}
    fns["lib"] = lambda: cupykern.fused_add_rms_norm(x, r, w, 1e-6)
    for key, name in (("fused", f"rowblock<{threads}, true, 0, 0>"), ("fused_cs", f"rowblock<{threads}, true, 0, 1>"),
                      ("fused_ldcs", f"rowblock<{threads}, true, 1, 0>"), ("stream4", f"rowblock<{threads}, false, 0, 0>")):
        k = mod.get_function(name)
        fns[key] = (lambda k=k: k((rows,), (threads,), (x, r, w, np.int32(rows), eps)))
    pipe = mod.get_function(f"pipelined<{threads}>")
    per_sm = min(2048 // threads, 65536 // (pipe.num_regs * threads))  # resident blocks an SM
    fns["fused_pipe"] = lambda: pipe((min(rows, sm * per_sm),), (threads,), (x, r, w, np.int32(rows), eps))
    gs = mod.get_function("stream4_gs")
    fns["stream4_gs"] = lambda: gs((sm * 8,), (256,), (x, r, w, np.int64(nleaf), np.int32(hidden // 8)))
    src = cupy.empty(2 * rows * hidden * 2, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    ck = mod.get_function("copy_kern")
    fns["copy_kern"] = lambda: ck((sm * 8,), (256,), (dst, src, np.int64(src.size // 16)))
    rt = cupy.cuda.runtime
    fns["copy_same"] = lambda: rt.memcpyAsync(dst.data.ptr, src.data.ptr, src.size, rt.memcpyDeviceToDevice,
                                              cupy.cuda.get_current_stream().ptr)
    # Check: each fused form from the same inputs against the library's result.
    ref_x, ref_r = x0.copy(), r0.copy()
    cupykern.fused_add_rms_norm(ref_x, ref_r, w, 1e-6)
    check = {}
    for key in ("fused", "fused_cs", "fused_ldcs", "fused_pipe"):
        x[...] = x0
        r[...] = r0
        fns[key]()
        same_r = bool((r.view(cupy.uint16) == ref_r.view(cupy.uint16)).all())
        dx = float(cupy.abs(x.astype(cupy.float32) - ref_x.astype(cupy.float32)).max())
        check[key] = {"residual_bitwise": same_r, "max_abs_diff_x": dx}
    print(rows, hidden, "check", check, flush=True)
    nbytes = 4 * rows * hidden * 2
    med = {k: [] for k in fns}
    order = list(fns)
    for rnd in range(3):
        for k in order[rnd:] + order[:rnd]:
            med[k].append(timing.time_cold(fns[k], repeat=30).median_us)
    best_copy = min(med["copy_same"])
    row = {"rows": rows, "hidden": hidden, "bytes": nbytes, "check": check, "us": med,
           "pct_of_copy_same": {k: 100 * best_copy / min(v) for k, v in med.items()}}
    results["points"].append(row)
    print(f"{rows} x {hidden}: " + ", ".join(f"{k} {min(v):.2f} us ({100 * best_copy / min(v):.1f} %)" for k, v in med.items()), flush=True)
    del x, r, x0, r0, src, dst

out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
json.dump(results, open(os.path.join(out, "streams.json"), "w"), indent=1)
