// gemv.cu: decode-size matrix-vector products (1-16 tokens) with fused prologue and
// epilogue, fp32 accumulation:
//   out = x @ weight^T                                     (gemv)
//   residual = round(residual + x @ weight^T)              (gemv_add_residual)
//   out = round(rms_norm(x)) @ weight^T                    (rms_norm_gemv; float32 out for logits)
//   out = silu(round(xn @ Wg^T)) * round(xn @ Wu^T), xn = round(rms_norm(x))
//                                                          (rms_norm_gemv_silu_and_mul)
//
// Part of the decode kernels (gemv.cu, attention.cu, tokens.cu): each can run inside a
// captured CUDA graph, since every size it needs from the sequence (position, length) is
// read from device memory, so a replay needs no new kernel arguments.
//
// Sources: GEMV fused with RMSNorm and the residual add as in the "no bubbles" megakernel
// instructions (Hazy Research, 2025-05-27) and vLLM's decode path; RMSNorm, Zhang &
// Sennrich 2019 (arXiv:1910.07467); SwiGLU, Shazeer 2020 (arXiv:2002.05202).
//
// Numerics: the normalised row and the gate and up products are rounded to T where the
// unfused ops store them (rms_norm -> GEMM -> silu_and_mul), up to fp32 summation order;
// the residual add takes the fp32 product (one rounding, not the unfused GEMM's two:
// with two, the first can move a cancelling sum by a unit of the product's last place). Every reduction runs in an order fixed by k alone,
// so a token's result does not depend on the other tokens of the batch.
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/activations.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- GEMV
// Warps per block of gemv_kernel; cupykern/plans.py::GEMV_WARPS mirrors it.
constexpr int kGemvWarps = 4;

// kEpilogue of gemv_kernel (cupykern/ops/decode.py::GEMV_EPILOGUES mirrors them).
constexpr int kEpilogueStore = 0;        // out[t, j] = round(acc)
constexpr int kEpilogueAddResidual = 1;  // out[t, j] = round(out[t, j] + acc): out is the residual
constexpr int kEpilogueSiluAndMul = 2;   // out[t, j] = round(silu(round(acc_j)) * round(acc_{j + n_out}))

// One warp per output feature j (two weight rows, j and j + n_out, for the SiLU gate),
// walked grid-stride. Lane l reads vectors l, l + 32, ... of the weight row, so the
// weight streams once through the warp in 16-byte loads; the x rows (at most
// kMaxTokens) are re-read from L1. Each lane accumulates its vectors in index order,
// then a butterfly over the warp sums the lanes: the order depends on k alone.
//
// kNorm: x is normalised on the fly, xn = round(x * inv_rms * norm_weight), with inv_rms
// = rsqrt(mean(x^2) + eps) per token, reduced by one warp per token before the barrier.
//
// Template parameters: T (x, weight, norm_weight) float / __half / __nv_bfloat16; OutT T,
// or float for kEpilogueStore (logits); kVecWidth 1 or 16 / sizeof(T) (the plan picks 16
// bytes only when k, the row strides and the pointers allow it); kMaxTokens 1, 4 or 16
// (registers per lane; num_tokens <= kMaxTokens).
// Launch contract (cupykern/plans.py::plan_gemv): block kGemvWarps * 32 threads, 1-D grid
// of any size. Mutates `out` only.
template <typename T, typename OutT, bool kNorm, int kEpilogue, int kVecWidth, int kMaxTokens>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(
    OutT* out,                // [num_tokens, n_out], out_row_stride apart
    const T* x,               // [num_tokens, k], x_row_stride apart
    const T* weight,          // [n_out (x2 for kEpilogueSiluAndMul), k], weight_row_stride apart
    const T* norm_weight,     // [k] when kNorm, else unused
    int num_tokens, int64_t k, int64_t n_out, int64_t x_row_stride, int64_t weight_row_stride,
    int64_t out_row_stride, float eps) {
  using V = Vec<T, kVecWidth>;
  constexpr int kRows = kEpilogue == kEpilogueSiluAndMul ? 2 : 1;
  constexpr bool kFastMath = sizeof(T) == 2;  // as activation.cu: intrinsics for 16-bit outputs
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  __shared__ float inv_rms[kMaxTokens];
  if constexpr (kNorm) {
    for (int t = warp; t < num_tokens; t += kGemvWarps) {
      const T* row = x + t * x_row_stride;
      float sumsq = 0.0f;
      for (int64_t i = lane * kVecWidth; i < k; i += 32 * kVecWidth) {
        const V v = load_vec<T, kVecWidth>(row + i);
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) sumsq += to_float(v.elt[e]) * to_float(v.elt[e]);
      }
      sumsq = warp_reduce<SumOp, 32>(sumsq);
      if (lane == 0) inv_rms[t] = rsqrtf(sumsq / static_cast<float>(k) + eps);
    }
    __syncthreads();
  }

  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp; j < n_out;
       j += static_cast<int64_t>(gridDim.x) * kGemvWarps) {
    float acc[kRows][kMaxTokens];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kMaxTokens; ++t) acc[r][t] = 0.0f;
    const T* w_row[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w_row[r] = weight + (j + r * n_out) * weight_row_stride;

#pragma unroll 4
    for (int64_t i = lane * kVecWidth; i < k; i += 32 * kVecWidth) {
      V w[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) w[r] = load_vec<T, kVecWidth>(w_row[r] + i);
      V g;
      if constexpr (kNorm) g = load_vec<T, kVecWidth>(norm_weight + i);
#pragma unroll
      for (int t = 0; t < kMaxTokens; ++t) {
        if (t < num_tokens) {
          const V xv = load_vec<T, kVecWidth>(x + t * x_row_stride + i);
#pragma unroll
          for (int e = 0; e < kVecWidth; ++e) {
            float xe = to_float(xv.elt[e]);
            if constexpr (kNorm) xe = to_float(from_float<T>(xe * inv_rms[t] * to_float(g.elt[e])));
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[r][t] = fmaf(to_float(w[r].elt[e]), xe, acc[r][t]);
          }
        }
      }
    }

#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t < num_tokens) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r][t] = warp_reduce<SumOp, 32>(acc[r][t]);
        if (lane == t % 32) {  // spread the stores over lanes
          OutT* o = out + t * out_row_stride + j;
          if constexpr (kEpilogue == kEpilogueStore) {
            *o = from_float<OutT>(acc[0][t]);
          } else if constexpr (kEpilogue == kEpilogueAddResidual) {
            *o = from_float<OutT>(to_float(*o) + acc[0][t]);
          } else {
            const float gate = to_float(from_float<T>(acc[0][t]));
            const float up = to_float(from_float<T>(acc[1][t]));
            *o = from_float<OutT>(silu<kFastMath>(gate) * up);
          }
        }
      }
    }
  }
}
