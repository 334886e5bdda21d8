"""qk_rms_norm_rope at 61-80 % of copy where apply_rope reaches 91 %: which structure closes it?

Hand-written NeoX bf16 kernels (head_dim = rotary_dim = 128, fp32 cos/sin cache, int64
positions, in place), each checked bit for bit against cupykern.qk_rms_norm_rope, timed
beside it: cold-L2 events at 256-16384 tokens (copy measured in the same run), graph
replay at 1-64. The structure is apply_rope_wide_kernel's (NOTES item 30): H heads a
thread, every head of a token in one round, the token's q/k loads issued before its
position -> cos/sin chain, a block per tokens_per_block tokens. Knobs:
  H      heads a thread (compile time)
  HOIST  1: the lane's q and k weight vectors loaded once, before the token walk;
         0: loaded beside each head's store (the library's wide kernel)
  MASK   1: the 8-lane sum of squares shuffles name their group only (a thread may leave
         early); 0: the whole warp (every thread runs the same iterations)
  MINB   __launch_bounds__ minimum blocks of 256 threads an SM (1: no register cap; 2: 128)
  grid   "block" (a block per tokens_per_block tokens) or "w2" (2 x resident blocks,
         grid-stride, the library's ROPE_WIDE_NORM_GRID_WAVES)
Beside them: "old", 9e2a362's library kernel (qk_old_wide_9e2a362.cuh: heads a thread a
launch argument, weights loaded beside the stores) launched as 9e2a362's plan_rope
launched it; "lib", the library of the tree that runs this, under plan constants LIB_PLANS
(heads a thread at prefill, grid waves). Bits: every kernel against 9e2a362's.
"""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern import jit, launcher, plans
from cupykern.timing import time_cold, time_graph, copy_bandwidth
from cupykern.registry.rope import _host_cache

SRC = r'''
#include <cuda_bf16.h>
typedef __nv_bfloat16 T;
struct __align__(16) V8 { unsigned short e[8]; };
__device__ __forceinline__ float wid(unsigned short v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ unsigned short rnd(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

template <int H, int HOIST, int MASK, int MINB>
__global__ void __launch_bounds__(256, MINB) qk_x(T* q, T* k, const T* __restrict__ qw, const T* __restrict__ kw,
    const long long* __restrict__ positions, const float* __restrict__ cache, int num_tokens, int nq, int nk,
    int slots, int tokens_per_block, int max_position, float eps) {
  const int tpt = slots * 8;
  const int tok_sub = threadIdx.x / tpt;
  if (MASK && tok_sub >= tokens_per_block) return;
  const int r = threadIdx.x - tok_sub * tpt;
  const int slot = r >> 3, lane = r & 7;
  const unsigned mask = MASK ? 0xffu << (threadIdx.x & 24) : 0xffffffffu;
  const int nh = nq + nk;
  const int lo = lane * 8, hi = 64 + lane * 8;
  V8 wqa, wqb, wka, wkb;
  if (HOIST) {
    wqa = *(const V8*)(qw + lo); wqb = *(const V8*)(qw + hi);
    wka = *(const V8*)(kw + lo); wkb = *(const V8*)(kw + hi);
  }
  const long long stride = (long long)gridDim.x * tokens_per_block;
  long long base = (long long)blockIdx.x * tokens_per_block;
  for (; MASK ? base + tok_sub < num_tokens : base < num_tokens; base += stride) {
    const long long token = base + tok_sub;
    const bool in_range = tok_sub < tokens_per_block && token < num_tokens;
    const long long p = in_range ? positions[token] : -1;
    V8 a[H], b[H];
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int h = slot + j * slots;
      if (in_range && h < nh) {
        const T* x = h < nq ? q + token * nq * 128 + h * 128 : k + token * nk * 128 + (h - nq) * 128;
        a[j] = *(const V8*)(x + lo); b[j] = *(const V8*)(x + hi);
      }
    }
    const bool ok = p >= 0 && p < max_position;
    float c[8], s[8];
    if (ok) {
      const float* row = cache + p * 128;
      const float4 c0 = *(const float4*)(row + lo), c1 = *(const float4*)(row + lo + 4);
      const float4 s0 = *(const float4*)(row + 64 + lo), s1 = *(const float4*)(row + 64 + lo + 4);
      c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w; c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
      s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w; s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
    }
    float inv[H];
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int h = slot + j * slots;
      float ss = 0.0f;
      if (ok && h < nh) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss = __fmaf_rn(wid(a[j].e[e]), wid(a[j].e[e]), ss);
          ss = __fmaf_rn(wid(b[j].e[e]), wid(b[j].e[e]), ss);
        }
      }
      if (MASK && j * slots >= nh) break;  // no lane of the block has head j (uniform)
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) ss += __shfl_xor_sync(mask, ss, off, 32);
      inv[j] = rsqrtf(ss * (1.0f / 128.0f) + eps);
    }
    if (!ok) continue;
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int h = slot + j * slots;
      if (h >= nh) break;
      const bool is_q = h < nq;
      V8 wa, wb;
      if (HOIST) { wa = is_q ? wqa : wka; wb = is_q ? wqb : wkb; }
      else { const T* w = is_q ? qw : kw; wa = *(const V8*)(w + lo); wb = *(const V8*)(w + hi); }
      V8 oa, ob;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x1 = wid(a[j].e[e]) * inv[j] * wid(wa.e[e]);
        const float x2 = wid(b[j].e[e]) * inv[j] * wid(wb.e[e]);
        oa.e[e] = rnd(__fmaf_rn(x1, c[e], -__fmul_rn(x2, s[e])));
        ob.e[e] = rnd(__fmaf_rn(x2, c[e], __fmul_rn(x1, s[e])));
      }
      T* x = is_q ? q + token * nq * 128 + h * 128 : k + token * nk * 128 + (h - nq) * 128;
      *(V8*)(x + lo) = oa; *(V8*)(x + hi) = ob;
    }
  }
}
'''
HEADS = {"8b": (2, 3, 4, 5), "70b": (3, 4, 5, 6)}
NAMES = sorted({f"qk_x<{h},{hoist},{m},{b}>" for hs in HEADS.values() for h in hs for hoist in (0, 1) for m in (0, 1)
                for b in (1, 2)})
mod = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=NAMES)
SMS = cp.cuda.Device().attributes["MultiProcessorCount"]
rng = np.random.default_rng(20261203)
bf = ml_dtypes.bfloat16
copy = copy_bandwidth()
res = {"copy_gbps": copy, "seed": 20261203, "sms": SMS, "points": [], "kernels": {}}
print(f"copy {copy:.0f} GB/s, {SMS} SMs", flush=True)
for nm in NAMES:
    f = mod.get_function(nm)
    res["kernels"][nm] = {"regs": f.num_regs, "local": f.local_size_bytes}
    print(nm, f.num_regs, "regs", f.local_size_bytes, "local", flush=True)
HERE = os.path.dirname(os.path.abspath(__file__))
OLD_SRC = jit.source("rope.cu") + open(os.path.join(HERE, "qk_old_wide_9e2a362.cuh")).read()
OLD_NAMES = ["qk_old_wide_kernel<__nv_bfloat16, float, long long, true, 8, 8>"]
old_mod = cp.RawModule(code=OLD_SRC, options=jit.COMPILE_OPTIONS, name_expressions=OLD_NAMES)
old_kernel = old_mod.get_function(OLD_NAMES[0])
res["kernels"]["old"] = {"regs": old_kernel.num_regs, "local": old_kernel.local_size_bytes}
print("old", old_kernel.num_regs, "regs", flush=True)


def old_plan(n, nh):
    """9e2a362's plan_rope for qk_rms_norm_rope, bf16 head_dim 128 (8 lanes a head): (heads a
    thread, head_slots, tokens_per_block, grid)."""
    if n < 4 * SMS:  # decode: the fewest of 2..4 heads that fits one round
        h = next(h for h in (2, 3, 4) if -(-nh // h) * 8 <= 256)
    else:
        h = 4
    slots = -(-nh // h)
    tpb = max(1, min(256 // (slots * 8), -(-n // SMS)))
    return h, slots, tpb, min(-(-n // tpb), 2 * 2 * SMS)


#: Library plan constants timed: (prefill heads a thread, grid waves).
LIB_PLANS = {"lib": {}, "lib w0": {"ROPE_WIDE_NORM_GRID_WAVES": 0},
             "lib h3 w0": {"ROPE_WIDE_NORM_HEADS_PER_THREAD": 3, "ROPE_WIDE_NORM_GRID_WAVES": 0},
             "lib h3": {"ROPE_WIDE_NORM_HEADS_PER_THREAD": 3}}
cache = cp.asarray(_host_cache(128))
EPS = 1e-6
SIZES = [int(x) for x in os.environ.get("SIZES", "1,16,64,256,1024,4096,16384").split(",")]
for model, nq, nk in (("8b", 32, 8), ("70b", 64, 8)):
    nh = nq + nk
    qw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    kw = cp.asarray((1 + 0.1 * rng.standard_normal(128)).astype(bf))
    for n in SIZES:
        pos = cp.asarray(rng.integers(0, cache.shape[0], n, dtype=np.int64))
        q0 = cp.asarray(rng.standard_normal((n, nq, 128)).astype(bf))
        k0 = cp.asarray(rng.standard_normal((n, nk, 128)).astype(bf))
        nbytes = 2 * (q0.nbytes + k0.nbytes) + n * 512 + n * 8
        oh, oslots, otpb, ogrid = old_plan(n, nh)
        oargs = (pos, cache, *map(np.int64, (n, nq, nk, 128, 128, cache.shape[0], 1, nq * 128, 128, nk * 128, 128,
                                             128)), np.float32(EPS), np.int32(oslots), np.int32(otpb), np.int32(oh))
        oblock = -(-oslots * 8 * otpb // 32) * 32
        q, k = q0.copy(), k0.copy()
        old_kernel((ogrid,), (oblock,), (q, k, qw, kw, *oargs))
        want_q, want_k = q.view(cp.uint16).copy(), k.view(cp.uint16).copy()

        def record(name, fn, extra):
            if n <= 64:
                t, kind = time_graph(fn), "graph"
            else:
                t, kind = time_cold(fn, repeat=30), "cold"
            pct = nbytes / (t.median_us * 1e-6) / 1e9 / copy * 100
            res["points"].append({"model": model, "num_tokens": n, "kernel": name, "us": t.median_us, "timing": kind,
                                  "pct_copy": pct, **extra})
            print(f"{model:3s} n={n:5d} {name:26s} {t.median_us:8.2f} us {pct:5.1f} % {extra}", flush=True)

        q, k = q0.copy(), k0.copy()
        record("old", lambda: old_kernel((ogrid,), (oblock,), (q, k, qw, kw, *oargs)),
               {"heads": oh, "block": oblock, "grid": ogrid, "tokens_per_block": otpb})
        saved = {name: getattr(plans, name) for c in LIB_PLANS.values() for name in c}
        for lname, consts in LIB_PLANS.items():
            if n < 4 * SMS and consts:
                continue  # the constants are prefill ones
            for name, value in {**saved, **consts}.items():
                setattr(plans, name, value)
            launcher.clear_caches()
            qc, kc = q0.copy(), k0.copy()
            cupykern.qk_rms_norm_rope(qc, kc, qw, kw, pos, cache, EPS, check_positions=False)
            ok = bool((qc.view(cp.uint16) == want_q).all() and (kc.view(cp.uint16) == want_k).all())
            record(lname, lambda: cupykern.qk_rms_norm_rope(q, k, qw, kw, pos, cache, EPS, check_positions=False),
                   {"bitwise_ok": ok})
        for name, value in saved.items():
            setattr(plans, name, value)
        launcher.clear_caches()
        for h in HEADS[model]:
            slots = -(-nh // h)
            tpt = slots * 8
            tpb = max(1, min(256 // tpt, -(-n // SMS)))
            block = -(-tpt * tpb // 32) * 32
            for hoist, m, minb in ((a, b, c) for a in (0, 1) for b in (0, 1) for c in (1, 2)):
                f = mod.get_function(f"qk_x<{h},{hoist},{m},{minb}>")
                occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, block, 0)
                grids = {"block": -(-n // tpb)}
                if n >= 4096:
                    grids["w2"] = min(grids["block"], 2 * occ * SMS)
                for gname, grid in grids.items():
                    rest = (pos, cache, np.int32(n), np.int32(nq), np.int32(nk), np.int32(slots), np.int32(tpb),
                            np.int32(cache.shape[0]), np.float32(EPS))
                    qc, kc = q0.copy(), k0.copy()
                    f((grid,), (block,), (qc, kc, qw, kw, *rest))
                    ok = bool((qc.view(cp.uint16) == want_q).all() and (kc.view(cp.uint16) == want_k).all())
                    record(f"H{h} hoist{hoist} mask{m} minb{minb} {gname}", lambda: f((grid,), (block,), (q, k, qw, kw, *rest)),
                           {"regs": f.num_regs, "blocks_per_sm": occ, "block": block, "grid": grid,
                            "tokens_per_block": tpb, "bitwise_ok": ok})
with open(os.path.join(os.environ.get("OUT", "."), "qk_iso.json"), "w") as fh:
    json.dump(res, fh, indent=1)
