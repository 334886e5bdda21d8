// norm.cu: rms_norm, fused_add_rms_norm, layer_norm.
//
// Math (all in fp32, one rounding to T at the store):
//   rms_norm:            y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset)
//   fused_add_rms_norm:  residual <- round_T(x + residual);  x <- rms_norm(residual)
//   layer_norm:          y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias
//                        (biased variance, computed two-pass from the mean: stable)
// Sources: RMSNorm, Zhang & Sennrich 2019 (arXiv:1910.07467); Gemma's (1 + w) from
// Hugging Face transformers' GemmaRMSNorm (weight_offset = 1, added in fp32);
// fused-add semantics as vLLM's fused_add_rms_norm and FlashInfer's
// fused_add_rmsnorm (the rounded sum is stored and normalised); LayerNorm, Ba et al.
// 2016 (arXiv:1607.06450), with torch.nn.functional.layer_norm's biased variance.
//
// Layout: num_rows rows of hidden_size elements, unit stride along a row, rows
// *_row_stride elements apart (64-bit offsets). weight and bias are [hidden_size].
// rms_norm_kernel takes num_rows, hidden_size and the strides as 32-bit ints
// (|value| < 2^31, checked in Python) and widens them: 64-bit ones cost it 0.04-0.07 us
// a call at decode sizes. The other two keep 64-bit ones, where 32-bit ones measured
// worse (bench/results/NOTES.md, item 19): layer_norm 1.4-2.3 % slower at 4096-16384
// tokens of llama-3.1-70b, fused_add_rms_norm 1.3-1.7 % at 4096 of 8b and an 8-byte spill
// in its fp32 decode layout, each for 0.01-0.07 us at decode sizes.
// Mutates: `out` (rms_norm, layer_norm; it may be `x` itself); x and residual
// (fused_add_rms_norm). Each element is read and written by the same thread, after
// the row's reduction, so in-place use is race-free.
//
// Numerics: every row reduction (sum of squares, sum, sum of squared deviations) is the
// row's fixed tree over 16-byte leaves (cupykern/reduce.cuh), so the bits depend on
// hidden_size and T only, never on the layout the planner picks for num_tokens.
//
// Template parameters:
//   T               float, __half, __nv_bfloat16
//   kThreadsPerRow  1, 2, 4, ..., 1024: threads that share one row
//   kVecWidth       1 or 16 / sizeof(T): elements per memory access
//   kVecsPerThread  1, 2, 4, 8: tree columns per thread, A; the first round of A leaves
//                   per thread stays in registers between passes. A layout matches the
//                   row's tree when kThreadsPerRow * A = J = min(next_pow2(leaves),
//                   2048), or A = 1 and kThreadsPerRow >= J; rows of at most 2048
//                   leaves also with kThreadsPerRow * A > J or = J / 2 (cupykern/plans.py::
//                   tree_fits; another A still reduces every element once, in another
//                   order).
//   kWarpSize       32
//   kExact          true only where hidden_size == kThreadsPerRow * kVecsPerThread * 16 /
//                   sizeof(T) (plans.RowLayout.fills), a precondition the kernel does not
//                   check (a shorter row would be read and written past its end): the
//                   leaf walk has no bounds, later rounds or partial leaf
//                   (cupykern/rows.cuh::for_each_leaf; sm_90 SASS of
//                   rms_norm_kernel<bf16, 256, 8, 2, 32>: 1104 -> 368 instructions, first
//                   x load at instruction 70 -> 50). The same leaves in the same order:
//                   the same bits. Built for every layout of rms_norm_kernel, for up to 2
//                   leaves a thread of the other two (plans.py::EXACT_WALK).
//   kReread         rms_norm_kernel only (default false): pass 2 reads the row again from L2
//                   (loads with evict_last, then evict_first) instead of keeping its first
//                   round in registers, as Inductor's kernel does: fewer registers, every
//                   thread of an SM resident (sm_90, 16-bit rows; fp32's 512 x 2 gained with
//                   31 -> 32; sm_75 takes 35-39). The same leaves in the same order: the same bits. Built with
//                   kExact on 16-byte vectors, 16-bit in 256 x 2 and 512 x 2, fp32 in
//                   512 x 2 (plans.reread_choices), so taken from 8192 rows of exactly
//                   4096 or 8192 16-bit elements and 4096 fp32 ones (plans.REREAD), where
//                   bf16 and fp32 measured 1.5-3.8 % faster than holding the row (fp16
//                   untimed; bench/results/NOTES.md, item 28). Before sm_80 the loads
//                   carry no hint (rows.cuh).
// Launch contract (planned by cupykern/plans.py::plan_rows): 1-D block of
// rows_per_block * kThreadsPerRow threads (a multiple of kWarpSize, at most 1024),
// 1-D grid of any size (blocks walk the rows grid-stride), no dynamic shared memory.
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
#include <cupykern/rms_norm_rows.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- rms_norm family
// One body for both ops (cupykern/rms_norm_rows.cuh): kFusedAdd adds `residual` first
// and writes the rounded sum back to it; the normalised value, rounded once to T, goes
// to `out` (which is x for the fused op).
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize, bool kExact,
          bool kReread = false>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) rms_norm_kernel(
    T* out,                          // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size]
    int num_rows, int hidden_size, int x_row_stride, int out_row_stride,
    float eps, float weight_offset) {
  rms_norm_rows<T, false, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize, kExact, kReread,
                kTreeRootInOneWarp>(
      StoreRounded<T>{out, out_row_stride}, x, nullptr, weight, num_rows, hidden_size, x_row_stride, 0,
      eps, weight_offset);
}

template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize, bool kExact>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) fused_add_rms_norm_kernel(
    T* x,                            // [num_rows, hidden_size] in: x, out: rms_norm(x + residual)
    T* residual,                     // [num_rows, hidden_size] in: residual, out: x + residual
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    float eps, float weight_offset) {
  rms_norm_rows<T, true, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize, kExact>(
      StoreRounded<T>{x, x_row_stride}, x, residual, weight, num_rows, hidden_size, x_row_stride,
      residual_row_stride, eps, weight_offset);
}

// ---------------------------------------------------------------- layer_norm
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize, bool kExact>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) layer_norm_kernel(
    T* out,                          // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size] or null (scale 1)
    const T* __restrict__ bias,      // [hidden_size] or null (shift 0)
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    float eps) {
  constexpr int L = leaf_width<T>();
  using V = Vec<T, L>;
  constexpr int kScratch = tree_scratch_floats<kThreadsPerRow, max_block_size<kThreadsPerRow>()>();
  __shared__ float scratch[2 * kScratch];
  ScratchPair<kScratch> scratch_pair(scratch);
  const RowGroup<kThreadsPerRow, one_row_per_block<T, kThreadsPerRow, kVecsPerThread, kVecWidth>()> g;
  const float inv_n = 1.0f / static_cast<float>(hidden_size);
  V cache[kVecsPerThread];
  float column[kVecsPerThread];
  // The decode layouts keep weight and bias in registers (rows.cuh::caches_weights).
  constexpr bool kCacheWeights = caches_weights<kThreadsPerRow, kVecsPerThread>();
  V weight_cache[kCacheWeights ? kVecsPerThread : 1], bias_cache[kCacheWeights ? kVecsPerThread : 1];

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    // This lane's leaves of the row, f(slot, column, v, count) (cupykern/rows.cuh).
    auto walk_leaves = [&](auto&& f) {
      for_each_leaf<T, kThreadsPerRow, kVecsPerThread, kExact>(hidden_size, active, g.lane, f);
    };
    const T* x_row = x + row * x_row_stride;
    T* out_row = out + row * out_row_stride;
    auto leaf_at = [&](int slot, int64_t v, int count) -> V {
      return slot >= 0 ? cache[slot] : load_leaf<T, kVecWidth>(x_row, v, count);
    };

    // Pass 1: load into registers, sum -> mean.
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = SumOp::identity();
    load_first_round<T, kThreadsPerRow, kExact>(hidden_size, active, g.lane, cache,
                                                [&](int64_t v) { return load_leaf<T, kVecWidth>(x_row, v, L); });
    // Requested right after the row, before anything waits (rows.cuh says why).
    if constexpr (kCacheWeights) {
      load_shared_first_round<T, kThreadsPerRow, kVecWidth, kExact>(weight, hidden_size, g.lane, weight_cache);
      load_shared_first_round<T, kThreadsPerRow, kVecWidth, kExact>(bias, hidden_size, g.lane, bias_cache);
    }
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      add_to_column<SumOp>(column, col, fold_leaf<SumOp, T>(a, count, [](float s, float e) {
        return __fadd_rn(s, e);
      }));
    });
    // Both reductions take the root in one warp (reduce.cuh, kTreeOneWarpMinWarps).
    const float mean = __fmul_rn(
        row_tree_reduce<SumOp, kThreadsPerRow, kVecsPerThread, kWarpSize, kTreeRootInOneWarp>(column, scratch_pair),
        inv_n);

    // Pass 2: sum of squared deviations from the mean (no E[x^2] - E[x]^2 cancellation).
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = SumOp::identity();
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      add_to_column<SumOp>(column, col, fold_leaf<SumOp, T>(a, count, [&](float s, float e) {
        const float d = __fsub_rn(e, mean);
        return __fmaf_rn(d, d, s);
      }));
    });
    const float ssd =
        row_tree_reduce<SumOp, kThreadsPerRow, kVecsPerThread, kWarpSize, kTreeRootInOneWarp>(column, scratch_pair);
    const float rstd = rsqrtf(__fmaf_rn(ssd, inv_n, eps));

    // Pass 3: normalise, scale, shift, round once, store.
    walk_leaves([&](int slot, int, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      float y[L];
#pragma unroll
      for (int e = 0; e < L; ++e) y[e] = __fmul_rn(__fsub_rn(element(a, e), mean), rstd);
      if (weight != nullptr) {
        const V w = shared_leaf<kCacheWeights, T, kVecWidth>(weight, weight_cache, slot, v, count);
#pragma unroll
        for (int e = 0; e < L; ++e) y[e] = __fmul_rn(y[e], element(w, e));
      }
      if (bias != nullptr) {
        const V b = shared_leaf<kCacheWeights, T, kVecWidth>(bias, bias_cache, slot, v, count);
#pragma unroll
        for (int e = 0; e < L; ++e) y[e] = __fadd_rn(y[e], element(b, e));
      }
      emit_leaf<T, kVecWidth>(v, count, y, [&](int64_t i, const auto& yy) { store_rounded<T>(out_row + i, yy); },
                              [&](int64_t i, float yy) { out_row[i] = from_float<T>(yy); });
    });
  }
}
