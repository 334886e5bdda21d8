// row_reduce.cu: one fp32 value per row: sum, sum of squares, max or min.
//
// Math (fp32 accumulation): sum = sum_i x_i, sumsq = sum_i x_i^2, max/min propagate
// NaN as NumPy does. "mean" is sum scaled by `scale` = 1 / hidden_size on the way out
// (scale is 1 otherwise). Source: NumPy's sum/max/min/mean over the last axis.
//
// Layout: x is num_rows rows of hidden_size elements, unit stride along a row, rows
// x_row_stride elements apart; out is float32 [num_rows], out_stride elements apart.
// Mutates `out` only.
//
// Template parameters: kOp (kRowSum, kRowSumSq, kRowMax, kRowMin below; cupykern/ops/
// row_reduce.py names the same values K_SUM, K_SUMSQ, K_MAX, K_MIN); T, kThreadsPerRow,
// kVecWidth, kWarpSize as in norm.cu (one pass, so nothing is kept in registers).
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
  __device__ __forceinline__ static float term(float v) { return v; }
};
template <> struct RowReduceOp<kRowSumSq> : SumOp {
  __device__ __forceinline__ static float term(float v) { return v * v; }
};
template <> struct RowReduceOp<kRowMax> : MaxOp {
  __device__ __forceinline__ static float term(float v) { return v; }
};
template <> struct RowReduceOp<kRowMin> : MinOp {
  __device__ __forceinline__ static float term(float v) { return v; }
};

template <int kOp, typename T, int kThreadsPerRow, int kVecWidth, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) row_reduce_kernel(
    float* out,                      // [num_rows], out_stride apart
    const T* x,                      // [num_rows, hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_stride,
    float scale) {
  using Op = RowReduceOp<kOp>;
  __shared__ float scratch[max_warps_per_block<kWarpSize>()];
  const RowGroup<kThreadsPerRow> g;
  const int64_t num_vecs = hidden_size / kVecWidth;

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    const T* x_row = x + row * x_row_stride;
    float acc = Op::identity();
    for_each_vec<kThreadsPerRow, 0>(active ? num_vecs : 0, g.lane, [&](int, int64_t v) {
      const Vec<T, kVecWidth> a = load_vec<T, kVecWidth>(x_row + v * kVecWidth);
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) acc = Op::apply(acc, Op::term(to_float(a.elt[e])));
    });
    for_each_tail<kThreadsPerRow>(num_vecs * kVecWidth, active ? hidden_size : 0, g.lane,
                                  [&](int64_t i) { acc = Op::apply(acc, Op::term(to_float(x_row[i]))); });
    acc = row_group_reduce<Op, kThreadsPerRow, kWarpSize>(acc, scratch);
    if (active && g.lane == 0) out[row * out_stride] = acc * scale;
  }
}
