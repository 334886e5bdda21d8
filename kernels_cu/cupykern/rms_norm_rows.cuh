// cupykern/rms_norm_rows.cuh: the RMSNorm row body, shared by norm.cu and quant.cu.
//
//   y = x / sqrt(mean(x^2) + eps) * (weight + weight_offset)     (fp32)
//   kFusedAdd: residual <- round_T(x + residual) first, and y normalises that sum.
//
// The body walks the rows (rows.cuh), accumulates the sum of squares, reduces it over
// the row group (reduce.cuh), and hands the row's values y to an epilogue, which
// decides what is written: StoreRounded (y rounded once to T: rms_norm,
// fused_add_rms_norm) or the FP8 epilogues of quant.cu. Everything up to the epilogue
// is one code path, so every output of one row sees the same y bits.
//
// Epilogue contract: epilogue(row, active, lane, scratch, each_y) is called once per
// row by every thread of the block (active is false for the threads of a row past the
// end, which must still join any row_group_reduce); each_y(vec_fn, tail_fn) visits
// this thread's elements of the row: vec_fn(i, y) for each full vector (float
// y[kVecWidth], elements i .. i + kVecWidth - 1), tail_fn(i, y) for each element of the
// scalar tail. each_y may be called more than once (a first pass for a row maximum);
// each call gives the same values (from the register cache, or read again).
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
  template <typename EachY>
  __device__ __forceinline__ void operator()(int64_t row, bool, int, float*, EachY&& each_y) const {
    T* out_row = out + row * row_stride;
    each_y([&](int64_t i, const auto& y) { store_rounded<T>(out_row + i, y); },
           [&](int64_t i, float y) { out_row[i] = from_float<T>(y); });
  }
};

template <typename T, bool kFusedAdd, int kThreadsPerRow, int kVecWidth, int kVecsPerThread,
          int kWarpSize, typename Epilogue>
__device__ __forceinline__ void rms_norm_rows(
    const Epilogue& epilogue,        // what becomes of y (see the contract above)
    const T* x,                      // [num_rows, hidden_size], x_row_stride apart
    T* residual,                     // [num_rows, hidden_size] or null (kFusedAdd only)
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    float eps, float weight_offset) {
  using V = Vec<T, kVecWidth>;
  __shared__ float scratch[max_warps_per_block<kWarpSize>()];
  const RowGroup<kThreadsPerRow> g;
  const int64_t num_vecs = hidden_size / kVecWidth;
  const int64_t tail_start = num_vecs * kVecWidth;
  V cache[kVecsPerThread];

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    const T* x_row = x + row * x_row_stride;
    T* res_row = kFusedAdd ? residual + row * residual_row_stride : nullptr;
    // The value that gets normalised: x, or the rounded sum x + residual.
    auto input_vec = [&](int64_t v) -> V {
      V a = load_vec<T, kVecWidth>(x_row + v * kVecWidth);
      if constexpr (kFusedAdd) {
        const V r = load_vec<T, kVecWidth>(res_row + v * kVecWidth);
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) a.elt[e] = from_float<T>(to_float(a.elt[e]) + to_float(r.elt[e]));
        store_vec<T, kVecWidth>(res_row + v * kVecWidth, a);
      }
      return a;
    };
    auto input_scalar = [&](int64_t i) -> float {
      if constexpr (kFusedAdd) {
        const T s = from_float<T>(to_float(x_row[i]) + to_float(res_row[i]));
        res_row[i] = s;
        return to_float(s);
      }
      return to_float(x_row[i]);
    };

    // Pass 1: load (and add), keep in registers, accumulate the sum of squares.
    float sumsq = 0.0f;
    for_each_vec<kThreadsPerRow, kVecsPerThread>(active ? num_vecs : 0, g.lane, [&](int slot, int64_t v) {
      const V a = input_vec(v);
      if (slot >= 0) cache[slot] = a;
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) sumsq += to_float(a.elt[e]) * to_float(a.elt[e]);
    });
    for_each_tail<kThreadsPerRow>(tail_start, active ? hidden_size : 0, g.lane, [&](int64_t i) {
      const float a = input_scalar(i);
      sumsq += a * a;
    });
    sumsq = row_group_reduce<SumOp, kThreadsPerRow, kWarpSize>(sumsq, scratch);
    const float inv_rms = rsqrtf(sumsq / static_cast<float>(hidden_size) + eps);

    // Pass 2 (each call of each_y): scale by inv_rms and the (offset) weight. Values
    // past the register cache are read again (from `residual` for the fused op, which
    // now holds the rounded sum this thread wrote).
    const T* again_row = kFusedAdd ? res_row : x_row;
    auto each_y = [&](auto&& vec_fn, auto&& tail_fn) {
      for_each_vec<kThreadsPerRow, kVecsPerThread>(active ? num_vecs : 0, g.lane, [&](int slot, int64_t v) {
        const V a = slot >= 0 ? cache[slot] : load_vec<T, kVecWidth>(again_row + v * kVecWidth);
        const V w = load_vec<T, kVecWidth>(weight + v * kVecWidth);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = to_float(a.elt[e]) * inv_rms * (to_float(w.elt[e]) + weight_offset);
        vec_fn(v * kVecWidth, y);
      });
      for_each_tail<kThreadsPerRow>(tail_start, active ? hidden_size : 0, g.lane, [&](int64_t i) {
        tail_fn(i, to_float(again_row[i]) * inv_rms * (to_float(weight[i]) + weight_offset));
      });
    };
    epilogue(row, active, g.lane, scratch, each_y);
  }
}

}  // namespace cupykern
