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
// Mutates: `out` (rms_norm, layer_norm; it may be `x` itself); x and residual
// (fused_add_rms_norm). Each element is read and written by the same thread, after
// the row's reduction, so in-place use is race-free.
//
// Template parameters:
//   T               float, __half, __nv_bfloat16
//   kThreadsPerRow  1, 2, 4, ..., 1024: threads that share one row
//   kVecWidth       1 or 16 / sizeof(T): elements per memory access
//   kVecsPerThread  1, 2, 4, 8: vectors per thread kept in registers between passes
//   kWarpSize       32
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
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) rms_norm_kernel(
    T* out,                          // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    float eps, float weight_offset) {
  rms_norm_rows<T, false, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreRounded<T>{out, out_row_stride}, x, nullptr, weight, num_rows, hidden_size, x_row_stride, 0,
      eps, weight_offset);
}

template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) fused_add_rms_norm_kernel(
    T* x,                            // [num_rows, hidden_size] in: x, out: rms_norm(x + residual)
    T* residual,                     // [num_rows, hidden_size] in: residual, out: x + residual
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    float eps, float weight_offset) {
  rms_norm_rows<T, true, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreRounded<T>{x, x_row_stride}, x, residual, weight, num_rows, hidden_size, x_row_stride,
      residual_row_stride, eps, weight_offset);
}

// ---------------------------------------------------------------- layer_norm
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) layer_norm_kernel(
    T* out,                          // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size] or null (scale 1)
    const T* __restrict__ bias,      // [hidden_size] or null (shift 0)
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    float eps) {
  using V = Vec<T, kVecWidth>;
  __shared__ float scratch[max_warps_per_block<kWarpSize>()];
  const RowGroup<kThreadsPerRow> g;
  const int64_t num_vecs = hidden_size / kVecWidth;
  const int64_t tail_start = num_vecs * kVecWidth;
  const float inv_n = 1.0f / static_cast<float>(hidden_size);
  V cache[kVecsPerThread];

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    const int64_t my_vecs = active ? num_vecs : 0;
    const int64_t my_end = active ? hidden_size : 0;
    const T* x_row = x + row * x_row_stride;
    T* out_row = out + row * out_row_stride;
    auto vec_at = [&](int slot, int64_t v) -> V {
      return slot >= 0 ? cache[slot] : load_vec<T, kVecWidth>(x_row + v * kVecWidth);
    };

    // Pass 1: load into registers, sum -> mean.
    float sum = 0.0f;
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = load_vec<T, kVecWidth>(x_row + v * kVecWidth);
      if (slot >= 0) cache[slot] = a;
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) sum += to_float(a.elt[e]);
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane, [&](int64_t i) { sum += to_float(x_row[i]); });
    const float mean = row_group_reduce<SumOp, kThreadsPerRow, kWarpSize>(sum, scratch) * inv_n;

    // Pass 2: sum of squared deviations from the mean (no E[x^2] - E[x]^2 cancellation).
    float ssd = 0.0f;
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = vec_at(slot, v);
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) {
        const float d = to_float(a.elt[e]) - mean;
        ssd += d * d;
      }
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane, [&](int64_t i) {
      const float d = to_float(x_row[i]) - mean;
      ssd += d * d;
    });
    const float rstd = rsqrtf(row_group_reduce<SumOp, kThreadsPerRow, kWarpSize>(ssd, scratch) * inv_n + eps);

    // Pass 3: normalise, scale, shift, round once, store.
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = vec_at(slot, v);
      float y[kVecWidth];
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) y[e] = (to_float(a.elt[e]) - mean) * rstd;
      if (weight != nullptr) {
        const V w = load_vec<T, kVecWidth>(weight + v * kVecWidth);
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] *= to_float(w.elt[e]);
      }
      if (bias != nullptr) {
        const V b = load_vec<T, kVecWidth>(bias + v * kVecWidth);
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] += to_float(b.elt[e]);
      }
      store_rounded<T, kVecWidth>(out_row + v * kVecWidth, y);
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane, [&](int64_t i) {
      float y = (to_float(x_row[i]) - mean) * rstd;
      if (weight != nullptr) y *= to_float(weight[i]);
      if (bias != nullptr) y += to_float(bias[i]);
      out_row[i] = from_float<T>(y);
    });
  }
}
