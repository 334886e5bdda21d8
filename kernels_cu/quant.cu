// quant.cu: FP8 (E4M3FN) outputs fused into RMSNorm and SiLU-and-mul.
//
// Math (fp32; one rounding, to E4M3FN, per output element; cupykern/fp8.cuh):
//   rms_norm_quant:             out = round_e4m3fn(rms_norm(x) * inv_scale)
//   fused_add_rms_norm_quant:   residual <- round_T(x + residual);
//                               out = round_e4m3fn(rms_norm(residual) * inv_scale)
//   silu_and_mul_quant:         out = round_e4m3fn(silu(gate) * up * inv_scale)
//   *_dynamic_per_token_quant:  s[r] = max(min(max_i |y[r, i]|, scale_ub) / 448, 1 / (448 * 512))
//                               out[r, i] = round_e4m3fn(y[r, i] * inv_scale[r]),  scales[r] = s[r]
//   with inv_scale = round_fp32(1 / scale) (or 1 / s[r]): __frcp_rn, correctly rounded.
// y is the op's fp32 value (rms_norm as in norm.cu, act(gate) * up as in activation.cu,
// computed by the same code: cupykern/rms_norm_rows.cuh, cupykern/gated_rows.cuh).
// y * inv_scale is rounded to fp32, then to nearest even to E4M3FN, saturating to +-448
// (infinities too); NaN stays NaN (cupykern/fp8.cuh). The product with the reciprocal
// differs from round_e4m3fn(y / scale) only where y / scale lies within about 2^-23 of
// its value from a rounding boundary of E4M3FN, by one unit. `scale` is a device fp32
// scalar read once per thread, so a CUDA graph replays with its current value; 0 gives
// inv_scale = inf, so +-448 (and NaN for y = 0).
// A NaN in a row's y makes that row's dynamic scale NaN (the maximum propagates NaN),
// and so every element of the row NaN. scale_ub = +inf means no bound.
// Sources: vLLM's rms_norm_static_fp8_quant, fused_add_rms_norm_static_fp8_quant,
// silu_and_mul_quant (static per-tensor scale, multiplied by 1 / scale as here) and
// rms_norm_dynamic_per_token_quant (csrc/quantization/fused_kernels: the scale_ub
// bound and the minimum scale 1 / (448 * 512) of min_scaling_factor; vLLM divides y
// by the per-token scale there, here it multiplies by the reciprocal as for static); FlashInfer's rmsnorm_fp8 family; the E4M3FN format, OCP 8-bit Floating Point
// Specification (OFP8) rev. 1.0. vLLM clamps NaN to 448 (fmin/fmax); here NaN stays NaN.
//
// Layout: rows of hidden_size, *_row_stride elements apart, as norm.cu's, but the norm
// kernels here take 64-bit sizes and strides (norm.cu's rms_norm_kernel 32-bit ones);
// gate/up/out rows of d as activation.cu's (d and the strides 32-bit). out holds E4M3FN
// bit patterns, one byte per element, out_row_stride bytes (= elements) apart; scales is
// [num_rows, 1] fp32, scales_row_stride elements apart.
// Mutates: out, scales (dynamic) and residual (fused add). x, weight, gate, up, scale
// are read only; out must not overlap them (checked in Python).
//
// Template parameters: as norm.cu's rms_norm kernels without kExact (T, kThreadsPerRow,
// kVecWidth, kVecsPerThread, kWarpSize) and activation.cu's act_and_mul_kernel (T, kAct,
// kVecWidth, kGridStride). kVecWidth counts elements of T per access: the fp8 output is
// written kVecWidth bytes at a time, so out is aligned to kVecWidth bytes when
// kVecWidth > 1.
// Launch contract: the norm kernels as norm.cu (cupykern/plans.py::plan_rows), the
// activation kernel as activation.cu (cupykern/plans.py::plan_activation).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
#include <cupykern/fp8.cuh>
#include <cupykern/rms_norm_rows.cuh>
#include <cupykern/gated_rows.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- epilogues
// Static per-tensor scale: out = round_e4m3fn(y * (1 / scale)).
struct StoreE4m3fnRows {
  unsigned char* out;                // [num_rows, hidden_size], row_stride apart
  int64_t row_stride;
  float inv_scale;                   // 1.0f / scale
  template <typename Scratch, typename EachY>
  __device__ __forceinline__ void operator()(int64_t row, bool, int, Scratch&, EachY&& each_y) const {
    unsigned char* out_row = out + row * row_stride;
    each_y([&](int64_t i, const auto& y) { store_e4m3fn(out_row + i, y, inv_scale); },
           [&](int64_t i, float y) { out_row[i] = to_e4m3fn(y * inv_scale); });
  }
};

// Dynamic per-token scale: a first pass over y for max |y|, reduced over the row group,
// the row's scale (written once, by lane 0), then y / scale quantised.
template <int kThreadsPerRow, int kWarpSize>
struct StoreE4m3fnPerTokenRows {
  unsigned char* out;                // [num_rows, hidden_size], row_stride apart
  int64_t row_stride;
  float* scales;                     // [num_rows], scales_row_stride apart
  int64_t scales_row_stride;
  float scale_ub;                    // +inf: no bound
  template <typename Scratch, typename EachY>
  __device__ __forceinline__ void operator()(int64_t row, bool active, int lane, Scratch& scratch_pair,
                                             EachY&& each_y) const {
    float absmax = 0.0f;
    each_y([&](int64_t, const auto& y) {
#pragma unroll
             for (int e = 0; e < static_cast<int>(sizeof(y) / sizeof(y[0])); ++e) absmax = MaxOp::apply(absmax, fabsf(y[e]));
           },
           [&](int64_t, float y) { absmax = MaxOp::apply(absmax, fabsf(y)); });
    // The max of |y| is exact in any order (no signed zeros; a NaN y comes from arithmetic,
    // so every NaN is the one canonical NaN), so the layout's own order gives the same bits.
    absmax = row_group_reduce<MaxOp, kThreadsPerRow, kWarpSize>(absmax, scratch_pair);
    // Written as comparisons so that a NaN maximum stays NaN (fminf/fmaxf would drop it).
    float s = absmax > scale_ub ? scale_ub : absmax;
    s = s / kE4m3fnMax;
    const float min_scale = 1.0f / (kE4m3fnMax * 512.0f);
    s = s < min_scale ? min_scale : s;
    if (active && lane == 0) scales[row * scales_row_stride] = s;
    const float inv_s = __frcp_rn(s);
    unsigned char* out_row = out + row * row_stride;
    each_y([&](int64_t i, const auto& y) { store_e4m3fn(out_row + i, y, inv_s); },
           [&](int64_t i, float y) { out_row[i] = to_e4m3fn(y * inv_s); });
  }
};

// The store of silu_and_mul_quant: round_e4m3fn(y * (1 / scale)).
struct StoreE4m3fnGatedRows {
  unsigned char* out;                // [num_rows, d], row_stride apart
  int row_stride;
  float inv_scale;                   // 1.0f / scale
  template <int kVecWidth, typename Row>
  __device__ __forceinline__ void vec(Row row, int i, const float (&y)[kVecWidth]) const {
    store_e4m3fn<kVecWidth>(out + static_cast<int64_t>(row) * row_stride + i, y, inv_scale);
  }
  template <typename Row>
  __device__ __forceinline__ void scalar(Row row, int i, float y) const {
    out[static_cast<int64_t>(row) * row_stride + i] = to_e4m3fn(y * inv_scale);
  }
};

// ---------------------------------------------------------------- rms_norm, static scale
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) rms_norm_quant_kernel(
    unsigned char* out,              // [num_rows, hidden_size] E4M3FN bits
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size]
    const float* __restrict__ scale, // [1]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    float eps, float weight_offset) {
  rms_norm_rows<T, false, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreE4m3fnRows{out, out_row_stride, __frcp_rn(*scale)}, x, nullptr, weight, num_rows, hidden_size, x_row_stride, 0,
      eps, weight_offset);
}

template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) fused_add_rms_norm_quant_kernel(
    unsigned char* out,              // [num_rows, hidden_size] E4M3FN bits of rms_norm(x + residual)
    const T* x,                      // [num_rows, hidden_size]
    T* residual,                     // [num_rows, hidden_size] in: residual, out: x + residual
    const T* __restrict__ weight,    // [hidden_size]
    const float* __restrict__ scale, // [1]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    int64_t out_row_stride, float eps, float weight_offset) {
  rms_norm_rows<T, true, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreE4m3fnRows{out, out_row_stride, __frcp_rn(*scale)}, x, residual, weight, num_rows, hidden_size, x_row_stride,
      residual_row_stride, eps, weight_offset);
}

// ---------------------------------------------------------------- rms_norm, per-token scale
template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) rms_norm_dynamic_per_token_quant_kernel(
    unsigned char* out,              // [num_rows, hidden_size] E4M3FN bits
    float* scales,                   // [num_rows, 1], scales_row_stride apart
    const T* x,                      // [num_rows, hidden_size]
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    int64_t scales_row_stride, float eps, float weight_offset, float scale_ub) {
  rms_norm_rows<T, false, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreE4m3fnPerTokenRows<kThreadsPerRow, kWarpSize>{out, out_row_stride, scales, scales_row_stride, scale_ub}, x, nullptr,
      weight, num_rows, hidden_size, x_row_stride, 0, eps, weight_offset);
}

template <typename T, int kThreadsPerRow, int kVecWidth, int kVecsPerThread, int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>())
fused_add_rms_norm_dynamic_per_token_quant_kernel(
    unsigned char* out,              // [num_rows, hidden_size] E4M3FN bits of rms_norm(x + residual)
    float* scales,                   // [num_rows, 1], scales_row_stride apart
    const T* x,                      // [num_rows, hidden_size]
    T* residual,                     // [num_rows, hidden_size] in: residual, out: x + residual
    const T* __restrict__ weight,    // [hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t residual_row_stride,
    int64_t out_row_stride, int64_t scales_row_stride, float eps, float weight_offset, float scale_ub) {
  rms_norm_rows<T, true, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize>(
      StoreE4m3fnPerTokenRows<kThreadsPerRow, kWarpSize>{out, out_row_stride, scales, scales_row_stride, scale_ub}, x, residual,
      weight, num_rows, hidden_size, x_row_stride, residual_row_stride, eps, weight_offset);
}

// ---------------------------------------------------------------- act_and_mul, static scale
template <typename T, int kAct, int kVecWidth, bool kGridStride>
__global__ void __launch_bounds__(kActMaxBlockSize) act_and_mul_quant_kernel(
    unsigned char* out,              // [num_rows, d] E4M3FN bits, out_row_stride apart
    const T* gate,                   // [num_rows, d], gate_row_stride apart
    const T* up,                     // [num_rows, d], up_row_stride apart
    const float* __restrict__ scale, // [1]
    int d, int gate_row_stride, int up_row_stride, int out_row_stride,  // elements: |value| < 2^31, d < 2^31 - 16
    int64_t num_rows) {                                                 // last: only the grid-stride walk reads it
  act_and_mul_rows<T, kAct, kVecWidth, kGridStride>(StoreE4m3fnGatedRows{out, out_row_stride, __frcp_rn(*scale)},
                                                    gate, up, num_rows, d, gate_row_stride, up_row_stride);
}
