// row_reduce.cu: one fp32 value per row: sum, sum of squares, max or min.
//
// Math (fp32 accumulation): sum = sum_i x_i, sumsq = sum_i x_i^2, max/min propagate
// NaN as NumPy does. "mean" is sum scaled by `scale` = 1 / hidden_size on the way out
// (scale is 1 otherwise). Source: NumPy's sum/max/min/mean over the last axis.
//
// Layout: x is num_rows rows of hidden_size elements, unit stride along a row, rows
// x_row_stride elements apart; out is float32 [num_rows], out_stride elements apart.
// Sizes and strides arrive as 32-bit ints (|value| < 2^31, checked in Python), widened by
// the 64-bit row index: one parameter list with softmax.cu, where they measured faster;
// here they measured within the runs' spread (+0.03 to -0.04 us at 1-64 tokens, within
// 1.8 % at 4096; bench/results/NOTES.md, item 20).
// Mutates `out` only.
//
// The reduction is the row's fixed tree over 16-byte leaves (cupykern/reduce.cuh), so
// the bits do not depend on the layout; lane 0, which holds the tree's root exactly,
// writes it.
//
// Template parameters: kOp (kRowSum, kRowSumSq, kRowMax, kRowMin below; cupykern/ops/
// row_reduce.py names the same values K_SUM, K_SUMSQ, K_MAX, K_MIN); T, kThreadsPerRow,
// kVecWidth, kVecsPerThread (tree columns per thread; one pass, so no leaf is kept in
// registers), kWarpSize as in norm.cu.
// Launch contract: norm.cu's (cupykern/plans.py::plan_rows).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>

using namespace cupykern;

// The reductions kOp selects (an int template argument, so Python spells it as a number).
constexpr int kRowSum = 0;
constexpr int kRowSumSq = 1;
constexpr int kRowMax = 2;
constexpr int kRowMin = 3;

template <int kOp> struct RowReduceOp;
template <> struct RowReduceOp<kRowSum> : SumOp {
  __device__ __forceinline__ static float step(float s, float v) { return __fadd_rn(s, v); }
};
template <> struct RowReduceOp<kRowSumSq> : SumOp {
  __device__ __forceinline__ static float step(float s, float v) { return __fmaf_rn(v, v, s); }
};
template <> struct RowReduceOp<kRowMax> : MaxOp {
  __device__ __forceinline__ static float step(float s, float v) { return apply(s, v); }
};
template <> struct RowReduceOp<kRowMin> : MinOp {
  __device__ __forceinline__ static float step(float s, float v) { return apply(s, v); }
};

template <int kOp, typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) row_reduce_kernel(
    float* out,                      // [num_rows], out_stride apart
    const T* x,                      // [num_rows, hidden_size]
    int num_rows, int hidden_size, int x_row_stride, int out_stride,
    float scale) {
  using Op = RowReduceOp<kOp>;
  __shared__ float scratch[tree_scratch_floats<kThreadsPerRow, max_block_size<kThreadsPerRow>()>()];
  const RowGroup<kThreadsPerRow, one_row_per_block<T, kThreadsPerRow, kVecsPerThread, kVecWidth>()> g;

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    // This lane's leaves of the row, f(slot, column, v, count) (cupykern/rows.cuh).
    auto walk_leaves = [&](auto&& f) {
      for_each_leaf<T, kThreadsPerRow, kVecsPerThread>(hidden_size, active, g.lane, f);
    };
    const T* x_row = x + row * x_row_stride;
    float column[kVecsPerThread];
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = Op::identity();
    walk_leaves([&](int, int col, int64_t v, int count) {
      const Vec<T, leaf_width<T>()> a = load_leaf<T, kVecWidth>(x_row, v, count);
      add_to_column<Op>(column, col, fold_leaf<Op, T>(a, count, [](float s, float e) { return Op::step(s, e); }));
    });
    const float acc = row_tree_reduce<Op, kThreadsPerRow, kVecsPerThread, kWarpSize>(column, scratch);
    if (active && g.lane == 0) out[row * out_stride] = __fmul_rn(acc, scale);
  }
}
