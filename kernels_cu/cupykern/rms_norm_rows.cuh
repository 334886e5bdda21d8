// cupykern/rms_norm_rows.cuh: the RMSNorm row body, shared by norm.cu and quant.cu.
//
//   y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset)     (fp32)
//   kFusedAdd: residual <- round_T(x + residual) first, and y normalises that sum.
//
// The body walks the rows leaf by leaf (rows.cuh), folds the sum of squares into
// kVecsPerThread register columns and reduces them with the row's fixed tree
// (reduce.cuh: the bits depend on hidden_size and T, not on the layout), and hands the
// row's values y to an epilogue, which decides what is written: StoreRounded (y rounded
// once to T: rms_norm, fused_add_rms_norm) or the FP8 epilogues of quant.cu. Everything
// up to the epilogue is one code path, so every output of one row sees the same y bits.
//
// Epilogue contract: epilogue(row, active, lane, scratch_pair, each_y) is called once per
// row by every thread of the block (active is false for the threads of a row past the
// end, which must still join any row_group_reduce); each_y(vec_fn, tail_fn) visits
// this thread's elements of the row: vec_fn(i, y) for each whole leaf on the vector
// path (float y[L], L = 16 / sizeof(T), elements i .. i + L - 1, 16-byte aligned),
// tail_fn(i, y) for each element otherwise (the scalar path, a partial last leaf).
// each_y may be called more than once (a first pass for a row maximum); each call gives
// the same values (from the register cache, or read again).
//
// kExact: the layout fills the row exactly (rows.cuh::for_each_leaf); the same bits, no
// bounds. norm.cu's kernels choose it per call; quant.cu's FP8 norms keep the default.
// kReread: see the body; rms_norm_kernel's choice per call (plans.REREAD).
#pragma once
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>

namespace cupykern {

// The epilogue of rms_norm and fused_add_rms_norm: y rounded once to T, stored.
template <typename T>
struct StoreRounded {
  T* out;                            // [num_rows, hidden_size], row_stride apart
  int64_t row_stride;
  template <typename Scratch, typename EachY>
  __device__ __forceinline__ void operator()(int64_t row, bool, int, Scratch&, EachY&& each_y) const {
    T* out_row = out + row * row_stride;
    each_y([&](int64_t i, const auto& y) { store_rounded<T>(out_row + i, y); },
           [&](int64_t i, float y) { out_row[i] = from_float<T>(y); });
  }
};

// round_T(a + r), element by element (the fused add's sum, stored to residual).
template <typename T, int L>
__device__ __forceinline__ Vec<T, L> add_rounded(Vec<T, L> a, const Vec<T, L>& r) {
#pragma unroll
  for (int e = 0; e < L; ++e) a.elt[e] = from_float<T>(__fadd_rn(to_float(a.elt[e]), to_float(r.elt[e])));
  return a;
}
// bf16 rounds its sums two at a time (vec.cuh::round_into): the sum is squared next, so
// the compiler kept 16 single conversions a thread in the 256 x 2 decode layout, and the
// pairs took the decode calls 0.07-0.21 us less (bench/results/NOTES.md, item 24). Not
// fp16: its bounded 512 x 2 layout then spilled 4 bytes (sm_90).
template <int L>
__device__ __forceinline__ Vec<__nv_bfloat16, L> add_rounded(Vec<__nv_bfloat16, L> a, const Vec<__nv_bfloat16, L>& r) {
  float sum[L];
#pragma unroll
  for (int e = 0; e < L; ++e) sum[e] = __fadd_rn(element(a, e), element(r, e));
  round_into(a, sum);
  return a;
}

template <typename T, bool kFusedAdd, int kThreadsPerRow, int kVecWidth, int kVecsPerThread,
          int kWarpSize, bool kExact = false, bool kReread = false, bool kRootInOneWarp = false,
          typename Epilogue>
__device__ __forceinline__ void rms_norm_rows(
    const Epilogue& epilogue,        // what becomes of y (see the contract above)
    const T* x,                      // [num_rows, hidden_size], x_row_stride apart
    T* residual,                     // [num_rows, hidden_size] or null (kFusedAdd only)
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    float eps, float weight_offset) {
  constexpr int L = leaf_width<T>();
  using V = Vec<T, L>;
  constexpr int kScratch = tree_scratch_floats<kThreadsPerRow, max_block_size<kThreadsPerRow>()>();
  __shared__ float scratch[2 * kScratch];
  ScratchPair<kScratch> scratch_pair(scratch);
  constexpr bool kCacheWeight = caches_weights<kThreadsPerRow, kVecsPerThread>();
  // One row a block in the decode layouts (rows.cuh::one_row_per_block). The fused add
  // takes it in its exact walk only (the bounded one then spilled 8 bytes in fp32 512 x
  // 2), with its cached weights requested before the row loop as the kernel's first loads
  // (kWeightsFirst): requested in the loop, with no `active` branch before the row's
  // loads, the compiler issued them after the adds and the call took 0.03-0.05 us longer
  // at 1-64 tokens of llama-3.1-8b (bench/results/NOTES.md, item 23); first, it took
  // 0.00-0.06 us less (item 24).
  constexpr bool kOneRowPerBlock =
      one_row_per_block<T, kThreadsPerRow, kVecsPerThread, kVecWidth>() && (!kFusedAdd || kExact);
  constexpr bool kWeightsFirst = kFusedAdd && kOneRowPerBlock;
  static_assert(!kWeightsFirst || kCacheWeight, "one_row_per_block's layouts cache their weights");
  const RowGroup<kThreadsPerRow, kOneRowPerBlock> g;
  V cache[kVecsPerThread];
  // kReread: pass 2 reads the row again, from L2, instead of holding its first round in
  // registers (Inductor's rms_norm; plans.REREAD says where): pass 1 loads with
  // evict_last, pass 2 with evict_first. The registers freed let a whole SM's threads be
  // resident (sm_90 bf16 512 x 2: 40 registers -> 32); the same leaves in the same order,
  // so the same bits.
  static_assert(!kReread || !kFusedAdd, "the fused add's second pass reads the sum it stored, not x");
  constexpr Evict kFirstPass = kReread ? Evict::kLast : Evict::kNormal;
  constexpr Evict kSecondPass = kReread ? Evict::kFirst : Evict::kNormal;
  const unsigned long long first_policy = l2_policy<kFirstPass>();
  const unsigned long long second_policy = l2_policy<kSecondPass>();
  // See pass 1.
  constexpr bool kFusedAddLeafByLeaf =
      kFusedAdd && (kVecWidth != L || kVecsPerThread > 4 || max_block_size<kThreadsPerRow>() > 512);
  V weight_cache[kCacheWeight ? kVecsPerThread : 1];
  if constexpr (kWeightsFirst) {
    load_shared_first_round<T, kThreadsPerRow, kVecWidth, kExact>(weight, hidden_size, g.lane, weight_cache);
  }

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    // This lane's leaves of the row, f(slot, column, v, count) (cupykern/rows.cuh).
    auto walk_leaves = [&](auto&& f) {
      for_each_leaf<T, kThreadsPerRow, kVecsPerThread, kExact>(hidden_size, active, g.lane, f);
    };
    const T* x_row = x + row * x_row_stride;
    T* res_row = kFusedAdd ? residual + row * residual_row_stride : nullptr;
    // The value that gets normalised: x, or the rounded sum x + residual (stored back).
    auto input_leaf = [&](int64_t v, int count) -> V {
      V a = load_leaf_evict<T, kVecWidth, kFirstPass>(x_row, v, count, first_policy);
      if constexpr (kFusedAdd) {
        a = add_rounded(a, load_leaf<T, kVecWidth>(res_row, v, count));
        store_leaf<T, kVecWidth>(res_row, v, count, a);
      }
      return a;
    };

    // Pass 1: load (and add), keep the first round in registers, fold x^2 per column.
    float column[kVecsPerThread];
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = SumOp::identity();
    // The decode layouts request the weight with the row, before anything waits (rows.cuh
    // says why).
    if constexpr (kCacheWeight && !kWeightsFirst) {
      load_shared_first_round<T, kThreadsPerRow, kVecWidth, kExact>(weight, hidden_size, g.lane, weight_cache);
    }
    // The first round is loaded before the fold (rows.cuh::load_first_round). The fused
    // add requests every x and residual leaf of it before its first store to residual:
    // x and residual may be the same array, so the compiler may not move a load past
    // such a store, and leaf by leaf the round cost one memory round trip a leaf. Not on
    // the scalar path, past 4 leaves a thread or in 1024-thread blocks, where the two
    // register arrays spilled.
    if constexpr (kFusedAdd && !kFusedAddLeafByLeaf) {
      V res_cache[kVecsPerThread];
      load_first_round<T, kThreadsPerRow, kExact>(hidden_size, active, g.lane, cache,
                                                  [&](int64_t v) { return load_leaf<T, kVecWidth>(x_row, v, L); });
      load_first_round<T, kThreadsPerRow, kExact>(hidden_size, active, g.lane, res_cache,
                                                  [&](int64_t v) { return load_leaf<T, kVecWidth>(res_row, v, L); });
      for_each_first_round_leaf<T, kThreadsPerRow, kVecsPerThread, kExact>(
          hidden_size, active, g.lane, [&](int a, int64_t v) {
            cache[a] = add_rounded(cache[a], res_cache[a]);
            store_leaf<T, kVecWidth>(res_row, v, L, cache[a]);
          });
    } else if constexpr (!kFusedAdd) {
      load_first_round<T, kThreadsPerRow, kExact>(hidden_size, active, g.lane, cache,
                                                  [&](int64_t v) { return input_leaf(v, L); });
    }
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      V a;
      if constexpr (kFusedAddLeafByLeaf) {
        a = input_leaf(v, count);
        if (slot >= 0) cache[slot] = a;
      } else {
        a = slot >= 0 ? cache[slot] : input_leaf(v, count);
      }
      add_to_column<SumOp>(column, col, fold_leaf<SumOp, T>(a, count, [](float s, float e) {
        return __fmaf_rn(e, e, s);
      }));
    });
    // kRootInOneWarp: norm.cu's rms_norm takes it; the fused add and quant.cu's kernels do
    // not (reduce.cuh, kTreeOneWarpMinWarps).
    const float sumsq =
        row_tree_reduce<SumOp, kThreadsPerRow, kVecsPerThread, kWarpSize, kRootInOneWarp>(column, scratch_pair);
    const float inv_rms = rsqrtf(sumsq / static_cast<float>(hidden_size) + eps);

    // Pass 2 (each call of each_y): scale by inv_rms and the (offset) weight. Leaves past
    // the register cache are read again (from `residual` for the fused op, which now
    // holds the rounded sum this thread wrote).
    const T* again_row = kFusedAdd ? res_row : x_row;
    // Weights loaded before the loop are widened here, after the reduction, not before the
    // loop, where the widening would wait for them ahead of the row's loads (rows.cuh::
    // pinned says why that matters).
    if constexpr (kWeightsFirst) {
#pragma unroll
      for (int a = 0; a < kVecsPerThread; ++a) pin_value(weight_cache[a]);
    }
    auto each_y = [&](auto&& vec_fn, auto&& tail_fn) {
      walk_leaves([&](int slot, int, int64_t v, int count) {
        const V a = (slot >= 0 && !kReread)
                        ? cache[slot]
                        : load_leaf_evict<T, kVecWidth, kSecondPass>(again_row, v, count, second_policy);
        const V w = shared_leaf<kCacheWeight, T, kVecWidth>(weight, weight_cache, slot, v, count);
        float y[L];
#pragma unroll
        for (int e = 0; e < L; ++e) {
          y[e] = __fmul_rn(__fmul_rn(element(a, e), inv_rms), __fadd_rn(element(w, e), weight_offset));
        }
        emit_leaf<T, kVecWidth>(v, count, y, vec_fn, tail_fn);
      });
    };
    epilogue(row, active, g.lane, scratch_pair, each_y);
  }
}

}  // namespace cupykern
