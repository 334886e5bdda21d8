"""rms_norm at decode sizes, third bisect (NOTES item 23): from the library's side.

bisect_rms2.py left 0.09-0.15 us between the library's exact-walk kernel and H, a flat
kernel made of the library's pieces. This one starts from the library:
  lib     cupykern.rms_norm of the working tree (with RowGroup at compile time)
  raw     the same compiled kernel, launched bare with the recorded grid/block/args
  V0      a copy of rms_norm_rows' non-fused path (kExact, bf16, 2 leaves a thread),
          compiled here with the library's headers: must time as raw
  V+1     no RowGroup: lane = threadIdx.x, row = blockIdx.x, grid-stride step gridDim.x
  V+2     no `active` (true)
  V+4     32-bit row offsets and hidden_size inside the body
  V+8     the epilogue stores in the pass itself (no each_y / emit_leaf / StoreRounded)
  V+16    __launch_bounds__(1024), as H
  V31     all of them
  H       bisect_rms2.py's H (the floor)
Every step is checked bit for bit against the library. Two rounds in opposite orders.

Predictions (written before the run): raw = lib and V0 = raw within 0.02 us; +1 and +2
together -0.03..-0.06 (the instructions before the first x load); +4 -0.01..-0.03 (the
division's RCP waits for a 64-bit conversion); +8 and +16 about 0; V31 within 0.03 of H.
"""
import json, os
os.environ.setdefault("CUPYKERN_CACHE_DIR", "/tmp/ck-user")
import cupy as cp, numpy as np
import ml_dtypes
import cupykern
from cupykern import launcher
from cupykern.timing import time_graph

SRC = r'''
#include <cuda_bf16.h>
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
using namespace cupykern;
typedef __nv_bfloat16 T;
template <bool B, class A, class C> struct pick { using type = A; };
template <class A, class C> struct pick<false, A, C> { using type = C; };

// ---- H of bisect_rms2.py (pinned weights first, library reduce and store)
template <int K>
__device__ __forceinline__ void h_loop(T* out, const T* x, const T* w, int rows, int n, float eps, float off) {
  constexpr int kF = tree_scratch_floats<K, 1024>();
  __shared__ float sc[2 * kF];
  ScratchPair<kF> pair(sc);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    using LV = Vec<T, 8>;
    const int t = threadIdx.x;
    const T* wp = pinned(w);
    const LV w0 = load_vec<T, 8>(wp + t * 8), w1 = load_vec<T, 8>(wp + (t + K) * 8);
    const T* xr = x + r * n; T* orow = out + r * n;
    const LV a0 = load_vec<T, 8>(xr + t * 8), a1 = load_vec<T, 8>(xr + (t + K) * 8);
    float col[2] = {0.f, 0.f};
    for (int i = 0; i < 8; ++i) {
      const float v0 = to_float(a0.elt[i]), v1 = to_float(a1.elt[i]);
      col[0] = __fmaf_rn(v0, v0, col[0]); col[1] = __fmaf_rn(v1, v1, col[1]);
    }
    const float s = row_tree_reduce<SumOp, K, 2, 32>(col, pair);
    const float inv = rsqrtf(s / static_cast<float>(n) + eps);
    float y0[8], y1[8];
    for (int i = 0; i < 8; ++i) {
      y0[i] = __fmul_rn(__fmul_rn(to_float(a0.elt[i]), inv), __fadd_rn(to_float(w0.elt[i]), off));
      y1[i] = __fmul_rn(__fmul_rn(to_float(a1.elt[i]), inv), __fadd_rn(to_float(w1.elt[i]), off));
    }
    store_rounded<T, 8>(orow + t * 8, y0); store_rounded<T, 8>(orow + (t + K) * 8, y1);
  }
}

// ---- rms_norm_rows' non-fused path for kExact, with switches (kV bits, see the docstring)
template <int K, int kV>
__device__ __forceinline__ void v_rows(T* out, const T* x, const T* __restrict__ weight, int64_t num_rows,
                                       int64_t hidden_size_, int64_t x_row_stride, int64_t out_row_stride,
                                       float eps, float weight_offset) {
  constexpr bool kNoGroup = kV & 1, kNoActive = kV & 2, k32 = kV & 4, kDirect = kV & 8;
  constexpr int kVecsPerThread = 2, kVecWidth = 8, L = 8;
  using V = Vec<T, L>;
  using Idx = typename pick<k32, int, int64_t>::type;
  const Idx hidden_size = static_cast<Idx>(hidden_size_);
  constexpr int kScratch = tree_scratch_floats<K, max_block_size<K>()>();
  __shared__ float scratch[2 * kScratch];
  ScratchPair<kScratch> scratch_pair(scratch);
  const RowGroup<K> g;
  const int lane = kNoGroup ? static_cast<int>(threadIdx.x) : g.lane;
  const int64_t first = kNoGroup ? static_cast<int64_t>(blockIdx.x) : g.first_base();
  const int64_t step = kNoGroup ? static_cast<int64_t>(gridDim.x) : g.base_step();
  V cache[kVecsPerThread];
  V weight_cache[kVecsPerThread];
  for (int64_t base = first; base < num_rows; base += step) {
    const int64_t row = kNoGroup ? base : base + g.group;
    const bool active = kNoActive ? true : row < num_rows;
    auto walk_leaves = [&](auto&& f) { for_each_leaf<T, K, kVecsPerThread, true>(hidden_size, active, lane, f); };
    const T* x_row = k32 ? x + static_cast<int>(row) * static_cast<int>(x_row_stride) : x + row * x_row_stride;
    T* out_row = k32 ? out + static_cast<int>(row) * static_cast<int>(out_row_stride) : out + row * out_row_stride;
    float column[kVecsPerThread];
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = SumOp::identity();
    load_shared_first_round<T, K, kVecWidth, true>(weight, hidden_size, lane, weight_cache);
    load_first_round<T, K, true>(hidden_size, active, lane, cache,
                                 [&](int64_t v) { return load_leaf<T, kVecWidth>(x_row, v, L); });
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      const V a = slot >= 0 ? cache[slot] : load_leaf<T, kVecWidth>(x_row, v, count);
      add_to_column<SumOp>(column, col, fold_leaf<SumOp, T>(a, count, [](float s, float e) {
        return __fmaf_rn(e, e, s);
      }));
    });
    const float sumsq = row_tree_reduce<SumOp, K, kVecsPerThread, 32>(column, scratch_pair);
    const float inv_rms = rsqrtf(sumsq / static_cast<float>(hidden_size) + eps);
    auto each_y = [&](auto&& vec_fn, auto&& tail_fn) {
      walk_leaves([&](int slot, int, int64_t v, int count) {
        const V a = slot >= 0 ? cache[slot] : load_leaf<T, kVecWidth>(x_row, v, count);
        const V w = shared_leaf<true, T, kVecWidth>(weight, weight_cache, slot, v, count);
        float y[L];
#pragma unroll
        for (int e = 0; e < L; ++e) {
          y[e] = __fmul_rn(__fmul_rn(to_float(a.elt[e]), inv_rms), __fadd_rn(to_float(w.elt[e]), weight_offset));
        }
        if constexpr (kDirect) store_rounded<T, L>(out_row + v * L, y);
        else emit_leaf<T, kVecWidth>(v, count, y, vec_fn, tail_fn);
      });
    };
    each_y([&](int64_t i, const auto& y) { store_rounded<T>(out_row + i, y); },
           [&](int64_t i, float y) { out_row[i] = from_float<T>(y); });
  }
}

#define H_KERNEL(K) \
extern "C" __global__ void __launch_bounds__(1024) H##K(T* out, const T* x, const T* w, int rows, int n, int xs, int os, float eps, float off) { h_loop<K>(out, x, w, rows, n, eps, off); }
#define V_KERNEL(K, kV) \
extern "C" __global__ void __launch_bounds__((kV & 16) ? 1024 : max_block_size<K>()) V##kV##_##K( \
    T* out, const T* x, const T* __restrict__ w, int rows, int n, int xs, int os, float eps, float off) { \
  v_rows<K, kV>(out, x, w, rows, n, xs, os, eps, off); }
#define ALL(K) H_KERNEL(K) V_KERNEL(K, 0) V_KERNEL(K, 1) V_KERNEL(K, 2) V_KERNEL(K, 4) V_KERNEL(K, 8) \
  V_KERNEL(K, 16) V_KERNEL(K, 3) V_KERNEL(K, 31)
ALL(256)
ALL(512)
'''
VARIANTS = ("V0", "V1", "V2", "V4", "V8", "V16", "V3", "V31")
KERNELS_CU = os.path.join(os.path.dirname(cupykern.__file__), os.pardir, "kernels_cu")


def module():
    return cp.RawModule(code=SRC, options=("-std=c++17", "-ftz=true", "--device-as-default-execution-space",
                                           "-I" + os.path.abspath(KERNELS_CU)))


def main():
    mod = module()
    bf = ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    res = {"seed": 0, "times_us": {}}

    def t(name, fn):
        tm = time_graph(fn, replays=30)
        res["times_us"].setdefault(name, []).append(tm.median_us)
        print(f"{name:28s} {tm.median_us:6.3f} us", flush=True)

    cases = []
    for n, k in ((4096, 256), (8192, 512)):
        for rows in (1, 16, 64):
            x = cp.asarray(rng.standard_normal((rows, n)).astype(bf))
            w = cp.asarray(rng.standard_normal(n).astype(bf))
            out = cp.empty_like(x)
            ref = cupykern.rms_norm(x, w, 1e-6)
            with launcher.recording() as launches:
                cupykern.rms_norm(x, w, 1e-6, out=out)
            (rec,) = launches
            print(f"n{n} r{rows}: library launch grid {rec.grid} block {rec.block} "
                  f"kernel {rec.kernel.name if hasattr(rec.kernel, 'name') else rec.kernel}", flush=True)
            i32 = np.int32
            args = (out, x, w, i32(rows), i32(n), i32(n), i32(n), np.float32(1e-6), np.float32(0))
            steps = {"lib": lambda x=x, w=w, out=out: cupykern.rms_norm(x, w, 1e-6, out=out),
                     "raw": lambda rec=rec: rec.function(rec.grid, rec.block, rec.args, rec.shared_mem)}
            for name in ("H", *VARIANTS):
                f = mod.get_function(f"{name}{k}" if name == "H" else f"{name}_{k}")
                steps[name] = lambda f=f, rows=rows, k=k, args=args: f((rows,), (k,), args)
            for name, fn in steps.items():  # every step against the library's bits
                out.fill(0)
                fn()
                same = bool((out.view(cp.uint16) == ref.view(cp.uint16)).all())
                print(f"n{n} r{rows} {name}: bit-identical to the library: {same}", flush=True)
                assert same, name
            cases.append((f"n{n} r{rows}", steps))
    for order in (1, -1):
        for label, steps in cases:
            for name, fn in list(steps.items())[::order]:
                t(f"{label} {name}", fn)
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "bisect_rms3.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
