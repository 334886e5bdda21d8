"""apply_rope at prefill sizes: which structure reaches the copy's bandwidth?

Hand-written NeoX bf16 kernels (head_dim = rotary_dim = 128, fp32 cos/sin cache, in
place), each checked bit for bit against cupykern.apply_rope, cold-L2 events, the copy
measured in the same run. Knobs: H heads a thread, PIPE (grid-stride with the next
token's position and q/k requested before this token's cos/sin), POS (cos/sin row by
positions, or by the token index: no dependent chain).
"""
import json, os, sys
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern.timing import time_cold, copy_bandwidth
from cupykern.registry.rope import _host_cache

SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
struct __align__(16) V8 { unsigned short e[8]; };
__device__ __forceinline__ float wid(unsigned short v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ unsigned short rnd(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

template <int H, int PIPE, int POS>
__global__ void __launch_bounds__(256) rope_x(T* q, T* k, const long long* __restrict__ positions,
    const float* __restrict__ cache, int num_tokens, int nq, int nk, int slots, int tokens_per_block) {
  const int tpt = slots * 8;
  const int tok_sub = threadIdx.x / tpt;
  if (tok_sub >= tokens_per_block) return;
  const int r = threadIdx.x - tok_sub * tpt;
  const int slot = r >> 3, lane = r & 7;
  const int nh = nq + nk;
  const int lo = lane * 8, hi = 64 + lane * 8;
  const int stride = gridDim.x * tokens_per_block;
  int token = blockIdx.x * tokens_per_block + tok_sub;
  V8 a[H], b[H], a2[H], b2[H];
  long long p = 0, p2 = 0;
  auto ptr = [&](int t, int h) -> T* {
    return h < nq ? q + (long long)t * nq * 128 + h * 128 : k + (long long)t * nk * 128 + (h - nq) * 128; };
  auto load = [&](int t, V8 (&va)[H], V8 (&vb)[H], long long& pp) {
    pp = POS ? positions[t] : t;
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int h = slot + j * slots;
      if (h < nh) { const T* x = ptr(t, h); va[j] = *(const V8*)(x + lo); vb[j] = *(const V8*)(x + hi); }
    }
  };
  auto finish = [&](int t, V8 (&va)[H], V8 (&vb)[H], long long pp) {
    const float* row = cache + pp * 128;
    float c[8], s[8];
    const float4 c0 = *(const float4*)(row + lo), c1 = *(const float4*)(row + lo + 4);
    const float4 s0 = *(const float4*)(row + 64 + lo), s1 = *(const float4*)(row + 64 + lo + 4);
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w; s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int h = slot + j * slots;
      if (h >= nh) break;
      V8 oa, ob;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x1 = wid(va[j].e[e]), x2 = wid(vb[j].e[e]);
        oa.e[e] = rnd(__fmaf_rn(x1, c[e], -__fmul_rn(x2, s[e])));
        ob.e[e] = rnd(__fmaf_rn(x2, c[e], __fmul_rn(x1, s[e])));
      }
      T* x = ptr(t, h);
      *(V8*)(x + lo) = oa; *(V8*)(x + hi) = ob;
    }
  };
  if (!PIPE) {
    for (; token < num_tokens; token += stride) { load(token, a, b, p); finish(token, a, b, p); }
  } else {
    if (token >= num_tokens) return;
    load(token, a, b, p);
    while (true) {
      const int next = token + stride;
      if (next < num_tokens) load(next, a2, b2, p2);
      finish(token, a, b, p);
      if (next >= num_tokens) break;
#pragma unroll
      for (int j = 0; j < H; ++j) { a[j] = a2[j]; b[j] = b2[j]; }
      p = p2; token = next;
    }
  }
}
'''
NAMES = [f"rope_x<{h},{pipe},{pos}>" for h in (2, 3, 4, 5, 6) for pipe in (0, 1) for pos in (0, 1)]
mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=NAMES)
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
rng = np.random.default_rng(0)
bf = ml_dtypes.bfloat16
res = {"copy_gbps": copy_bandwidth(), "points": []}
print(f"copy {res['copy_gbps']:.0f} GB/s, {SMS} SMs", flush=True)


def kernel_info(name):
    f = mod.get_function(name)
    return f, f.num_regs, f.local_size_bytes


cache = cp.asarray(_host_cache(128))  # (131072, 128) fp32
for model, nq, nk, heads_choices in (("8b", 32, 8, (2, 4, 5)), ("70b", 64, 8, (3, 4, 6))):
    nh = nq + nk
    for n in (4096, 16384):
        for pos_kind in ("random", "arange"):
            positions = (cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64)) if pos_kind == "random"
                         else cp.arange(n, dtype=cp.int64))
            q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
            k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
            nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * 8
            q, k = q0.copy(), k0.copy()
            cupykern.apply_rope(q, k, positions, cache, check_positions=False)
            want_q, want_k = q.copy(), k.copy()

            def record(name, fn, extra):
                t = time_cold(fn, repeat=30)
                pct = nbytes / (t.median_us * 1e-6) / 1e9 / res["copy_gbps"] * 100
                row = {"model": model, "num_tokens": n, "positions": pos_kind, "kernel": name, "us": t.median_us,
                       "pct_copy": pct, **extra}
                res["points"].append(row)
                print(f"{model} n={n:5d} {pos_kind:6s} {name:34s} {t.median_us:8.2f} us {pct:5.1f} % {extra}", flush=True)

            record("lib", lambda: cupykern.apply_rope(q, k, positions, cache, check_positions=False), {})
            for h in heads_choices:
                slots = -(-nh // h)
                tpt = slots * 8
                tpb = max(1, 256 // tpt)
                block = -(-tpt * tpb // 32) * 32
                for pos in (1, 0):
                    for pipe in (0, 1):
                        f, regs, local = kernel_info(f"rope_x<{h},{pipe},{pos}>")
                        occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, block, 0)
                        grids = [-(-n // tpb)] if not pipe else [w * occ * SMS for w in (1, 2)]
                        for grid in grids:
                            args = (q, k, positions, cache, np.int32(n), np.int32(nq), np.int32(nk), np.int32(slots),
                                    np.int32(tpb))
                            if pos:  # bits against the library (one call on fresh copies)
                                qc, kc = q0.copy(), k0.copy()
                                f((grid,), (block,), (qc, kc, *args[2:]))
                                ok = bool((qc.view(cp.uint16) == want_q.view(cp.uint16)).all()
                                          and (kc.view(cp.uint16) == want_k.view(cp.uint16)).all())
                            else:
                                ok = None
                            record(f"H{h} pipe{pipe} pos{pos} grid{grid}",
                                   lambda: f((grid,), (block,), args),
                                   {"regs": regs, "local": local, "blocks_per_sm": occ, "block": block,
                                    "tokens_per_block": tpb, "bitwise_ok": ok})
out = os.environ.get("OUT", ".")
with open(os.path.join(out, "rope_iso.json"), "w") as fh:
    json.dump(res, fh, indent=1)
