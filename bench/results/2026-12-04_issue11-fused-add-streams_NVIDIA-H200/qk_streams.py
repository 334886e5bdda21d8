"""qk_rms_norm_rope reaches about 88 % of a cudaMemcpy of its own bytes at 4096 tokens,
apply_rope 92-96 % on the same q and k (NOTES items 37, 38). Does a plain kernel of
another shape do better? NOTES item 38, call C.

Stand-alone qk kernels (bf16, NeoX, head_dim = rotary_dim = 128, fp32 cache, int64
positions, 16-byte vectors: 8 lanes a head, lane u holding dims [8u, 8u+8) and
[64+8u, 64+8u+8)), one token a block, kHeadsPerThread heads a thread (all of a token's
heads in one round, as the library's wide kernel), grid = num_tokens:
  tok_h1 / tok_h2 / tok_hN   1, 2 or the library's heads a thread (5 for 8b, 3 for 70b)
  tok_h1_stream              tok_h1 without the norm's reduction and the rotation (y = x * w):
                             the same streams in the same layout, nothing to wait for
Beside them: the library's qk_rms_norm_rope and apply_rope on the same inputs
(cupykern.registry.rope's, positions random over the model's table), and a cudaMemcpy of
the same bytes (each direction rounded down to 4096 bytes, as bench/peers.py). Cold L2,
three rounds in rotating order, 8b and 70b at 4096 and 16384 tokens. The stand-alone qk
kernels compute the library's per-element expressions in its order, so their output is
compared bit for bit.
"""
import json
import os
import sys

import cupy
import numpy as np

import cupykern
from cupykern import models, timing
from cupykern.registry.rope import _min_bytes, _rope_inputs

SRC = r"""
#include <cuda_bf16.h>
__device__ __forceinline__ float lo16(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi16(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ void unpack(uint4 v, float* f) {
  f[0] = lo16(v.x); f[1] = hi16(v.x); f[2] = lo16(v.y); f[3] = hi16(v.y);
  f[4] = lo16(v.z); f[5] = hi16(v.z); f[6] = lo16(v.w); f[7] = hi16(v.w);
}
__device__ __forceinline__ unsigned pack(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<unsigned*>(&h);
}
__device__ __forceinline__ uint4 repack(const float* f) {
  return make_uint4(pack(f[0], f[1]), pack(f[2], f[3]), pack(f[4], f[5]), pack(f[6], f[7]));
}

// Block = one token, (kHeads / kHeadsPerThread) slots of 8 lanes; slot s holds heads
// s, s + slots, ... Heads [0, num_q_heads) are q's, the rest k's. 16 uint4 a head.
template <int kHeads, int kHeadsPerThread, bool kNormRotate>
__global__ void __launch_bounds__(kHeads / kHeadsPerThread * 8) qk_token(
    uint4* q, uint4* k, const uint4* __restrict__ qw, const uint4* __restrict__ kw,
    const long long* __restrict__ positions, const float* __restrict__ cache,
    int num_q_heads, float eps) {
  constexpr int kSlots = kHeads / kHeadsPerThread;
  const int lane = threadIdx.x & 7, slot = threadIdx.x >> 3;
  const long long token = blockIdx.x;
  const int num_kv_heads = kHeads - num_q_heads;
  const long long pos = positions[token];
  uint4 a[kHeadsPerThread], b[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int h = slot + j * kSlots;
    const uint4* x = h < num_q_heads ? q + (token * num_q_heads + h) * 16 : k + (token * num_kv_heads + h - num_q_heads) * 16;
    a[j] = x[lane];
    b[j] = x[8 + lane];
  }
  float c[8], s[8];
  if (kNormRotate) {
    const float4* row = reinterpret_cast<const float4*>(cache + pos * 128);
    const float4 c0 = row[2 * lane], c1 = row[2 * lane + 1], s0 = row[16 + 2 * lane], s1 = row[16 + 2 * lane + 1];
    c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
    s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w; s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
  }
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int h = slot + j * kSlots;
    float fa[8], fb[8], wa[8], wb[8];
    unpack(a[j], fa); unpack(b[j], fb);
    const uint4* w = h < num_q_heads ? qw : kw;
    unpack(w[lane], wa); unpack(w[8 + lane], wb);
    float inv = 1.0f;
    if (kNormRotate) {
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) { ss = __fmaf_rn(fa[e], fa[e], ss); ss = __fmaf_rn(fb[e], fb[e], ss); }
#pragma unroll
      for (int o = 4; o > 0; o >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(0xffffffffu, ss, o, 32));
      inv = rsqrtf(ss * (1.0f / 128.0f) + eps);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) { fa[e] = fa[e] * inv * wa[e]; fb[e] = fb[e] * inv * wb[e]; }
    if (kNormRotate) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x1 = fa[e], x2 = fb[e];
        fa[e] = __fmaf_rn(x1, c[e], -__fmul_rn(x2, s[e]));
        fb[e] = __fmaf_rn(x2, c[e], __fmul_rn(x1, s[e]));
      }
    }
    uint4* x = h < num_q_heads ? q + (token * num_q_heads + h) * 16 : k + (token * num_kv_heads + h - num_q_heads) * 16;
    x[lane] = repack(fa);
    x[8 + lane] = repack(fb);
  }
}
"""

OUT = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else os.environ.get("OUT", ".")
GRANULE = 4096
configs = {"llama-3.1-8b": (40, 5), "llama-3.1-70b": (72, 3)}
names = []
for heads, lib_hpt in configs.values():
    for hpt in sorted({1, 2, lib_hpt}):
        names.append(f"qk_token<{heads}, {hpt}, true>")
    names.append(f"qk_token<{heads}, 1, false>")
mod = cupy.RawModule(code=SRC, options=("--std=c++17",), name_expressions=names)
seed = 20261204
rng = np.random.default_rng(seed)
results = {"seed": seed, "points": [], "registers": {n: mod.get_function(n).num_regs for n in names}}
print(results["registers"], flush=True)
for model_name, (heads, lib_hpt) in configs.items():
    model = models.get(model_name)
    for n in (4096, 16384):
        i = _rope_inputs(rng, n, 128, cupykern.bfloat16, with_weights=True, model=model)
        q0, k0 = i["q"].copy(), i["k"].copy()
        q, k = i["q"], i["k"]
        nq = q.shape[1]
        assert nq + k.shape[1] == heads and i["cos_sin_cache"].dtype == np.float32 and i["positions"].dtype == np.int64
        fns = {"lib_qk": lambda: cupykern.qk_rms_norm_rope(q, k, i["q_weight"], i["k_weight"], i["positions"],
                                                           i["cos_sin_cache"], i["eps"], check_positions=False),
               "lib_apply_rope": lambda: cupykern.apply_rope(q, k, i["positions"], i["cos_sin_cache"], check_positions=False)}
        for hpt in sorted({1, 2, lib_hpt}):
            kern = mod.get_function(f"qk_token<{heads}, {hpt}, true>")
            fns[f"tok_h{hpt}"] = (lambda kern=kern, hpt=hpt: kern(
                (n,), (heads // hpt * 8,), (q, k, i["q_weight"], i["k_weight"], i["positions"], i["cos_sin_cache"],
                                            np.int32(nq), np.float32(i["eps"]))))
        kern = mod.get_function(f"qk_token<{heads}, 1, false>")
        fns["tok_h1_stream"] = lambda kern=kern: kern((n,), (heads * 8,), (q, k, i["q_weight"], i["k_weight"],
                                                                          i["positions"], i["cos_sin_cache"],
                                                                          np.int32(nq), np.float32(i["eps"])))
        nbytes = _min_bytes(i) + 2 * i["q_weight"].nbytes
        half = max(GRANULE, nbytes // 2 // GRANULE * GRANULE)
        src, dst = cupy.empty(half, dtype=cupy.uint8), cupy.empty(half, dtype=cupy.uint8)
        rt = cupy.cuda.runtime
        fns["copy_same"] = lambda: rt.memcpyAsync(dst.data.ptr, src.data.ptr, half, rt.memcpyDeviceToDevice,
                                                  cupy.cuda.get_current_stream().ptr)
        # Bits: each stand-alone qk against the library's, from the same inputs.
        q[...], k[...] = q0, k0
        fns["lib_qk"]()
        ref_q, ref_k = q.copy(), k.copy()
        check = {}
        for name in [f for f in fns if f.startswith("tok_h") and not f.endswith("stream")]:
            q[...], k[...] = q0, k0
            fns[name]()
            check[name] = bool((q.view(cupy.uint16) == ref_q.view(cupy.uint16)).all()
                               and (k.view(cupy.uint16) == ref_k.view(cupy.uint16)).all())
        med = {f: [] for f in fns}
        order = list(fns)
        for rnd in range(3):
            for f in order[rnd:] + order[:rnd]:
                med[f].append(timing.time_cold(fns[f], repeat=30).median_us)
        best_copy = min(med["copy_same"])
        results["points"].append({"model": model_name, "num_tokens": n, "min_bytes": nbytes, "bitwise": check, "us": med,
                                  "pct_of_copy_same": {f: 100 * best_copy / min(v) for f, v in med.items()}})
        print(f"{model_name} {n} bitwise {check}", flush=True)
        print(f"{model_name} {n}: " + ", ".join(f"{f} {' '.join(f'{t:.2f}' for t in v)} ({100 * best_copy / min(v):.1f} %)"
                                                for f, v in med.items()), flush=True)
        del q, k, q0, k0, i, src, dst
json.dump(results, open(os.path.join(OUT, "qk_streams.json"), "w"), indent=1)
