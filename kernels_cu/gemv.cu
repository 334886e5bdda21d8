// gemv.cu: decode-size matrix-vector products (1-16 tokens) with fused prologue and
// epilogue, fp32 accumulation:
//   out = x @ weight^T                                     (gemv)
//   residual = round(residual + x @ weight^T)              (gemv_add_residual)
//   out = round(rms_norm(x)) @ weight^T                    (rms_norm_gemv; float32 out for logits)
//   out = silu(xn @ Wg^T) * (xn @ Wu^T), xn = round(rms_norm(x))
//                                                          (rms_norm_gemv_silu_and_mul)
//   q_out, k_cache[p], v_cache[p] = rope(xn @ Wqkv^T)       (rms_norm_gemv_rope_kv_append)
//
// Part of the decode kernels (gemv.cu, attention.cu, tokens.cu): each can run inside a
// captured CUDA graph, since every size it needs from the sequence (position, length) is
// read from device memory, so a replay needs no new kernel arguments; and each may be
// launched as a programmatic dependent launch (pdl.cuh: it waits for the kernels before
// it before it reads or writes anything they touch).
//
// Sources: GEMV fused with RMSNorm and the residual add as in the "no bubbles" megakernel
// instructions (Hazy Research, 2025-05-27) and vLLM's decode path; RMSNorm, Zhang &
// Sennrich 2019 (arXiv:1910.07467); SwiGLU, Shazeer 2020 (arXiv:2002.05202).
//
// Numerics: the normalised row is rounded to T as rms_norm stores it; the products stay
// in fp32 through the epilogue (residual add, SiLU gate, rotation) and the result is
// rounded once. The unfused ops round twice (the GEMM's output, then the epilogue's):
// one rounding is closer to the exact value, and where the epilogue cancels (a residual
// add, a rotation) the difference can reach a unit in the last place of the product. Every reduction runs in an order fixed by k alone,
// so a token's result does not depend on the other tokens of the batch.
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/activations.cuh>
#include <cupykern/pdl.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- GEMV
// Warps per block of gemv_kernel; cupykern/plans.py::GEMV_WARPS mirrors it.
constexpr int kGemvWarps = 4;

// kEpilogue of gemv_kernel (cupykern/ops/decode.py::GEMV_EPILOGUES mirrors them).
constexpr int kEpilogueStore = 0;        // out[t, j] = round(acc)
constexpr int kEpilogueAddResidual = 1;  // out[t, j] = round(out[t, j] + acc): out is the residual
constexpr int kEpilogueSiluAndMul = 2;   // out[t, j] = round(silu(acc_j) * acc_{j + n_out})

// ---------------------------------------------------------------- shared warp GEMV core
// kAhead: weight vectors a lane requests before anything else (the norm's reduction,
// the barrier), so their latency overlaps the norm instead of following it; kAhead * 32
// vectors of 16 bytes cover a row of kAhead * 256 16-bit elements. 0 turns it off.
// Arrays of them are declared with ahead_slots(kAhead) >= 1 entries (C++ has no empty ones).
constexpr int ahead_slots(int ahead) { return ahead > 0 ? ahead : 1; }

// Requests this lane's first kAhead vectors of each of kRows weight rows.
template <typename T, int kVecWidth, int kRows, int kAhead>
__device__ __forceinline__ void load_ahead(Vec<T, kVecWidth> (&ahead)[ahead_slots(kAhead)][kRows],
                                           const T* const (&w_row)[kRows], int64_t k, int lane) {
#pragma unroll
  for (int u = 0; u < kAhead; ++u) {
    const int64_t i = (lane + 32 * u) * static_cast<int64_t>(kVecWidth);
    if (i < k) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) ahead[u][r] = load_vec<T, kVecWidth>(w_row[r] + i);
    }
  }
}

// inv_rms[t] = rsqrt(mean(x[t]^2) + eps) for each token, computed by every warp for
// itself (lanes sum their vectors in index order, then a butterfly): no barrier and no
// shared memory between the kernel's wait and its products, and every warp gets the
// same bits. The rows are small (the hidden size) and shared through L1.
template <typename T, int kVecWidth, int kMaxTokens>
__device__ __forceinline__ void warp_inv_rms(float (&inv_rms)[kMaxTokens], const T* x, int num_tokens, int64_t k,
                                             int64_t x_row_stride, float eps, int lane) {
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    inv_rms[t] = 0.0f;
    if (t < num_tokens) {
      const T* row = x + t * x_row_stride;
      float sumsq = 0.0f;
      for (int64_t i = lane * kVecWidth; i < k; i += 32 * kVecWidth) {
        const Vec<T, kVecWidth> v = load_vec<T, kVecWidth>(row + i);
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) sumsq += to_float(v.elt[e]) * to_float(v.elt[e]);
      }
      sumsq = warp_reduce<SumOp, 32>(sumsq);
      inv_rms[t] = rsqrtf(sumsq / static_cast<float>(k) + eps);
    }
  }
}

// acc[r][t] = sum_i w_row[r][i] * xn[t][i] in every lane of the warp, xn = x or, when
// kNorm, round(x * inv_rms[t] * norm_weight). Lane l takes vectors l, l + 32, ... (the
// first kAhead of them from `ahead` when have_ahead), each lane sums in index order,
// then a butterfly adds the lanes: the order depends on k alone.
template <typename T, bool kNorm, int kRows, int kVecWidth, int kMaxTokens, int kAhead>
__device__ __forceinline__ void warp_products(float (&acc)[kRows][kMaxTokens], const T* const (&w_row)[kRows],
                                              const Vec<T, kVecWidth> (&ahead)[ahead_slots(kAhead)][kRows],
                                              bool have_ahead,
                                              const T* x, const T* norm_weight,
                                              const float (&inv_rms)[kMaxTokens], int num_tokens, int64_t k,
                                              int64_t x_row_stride, int lane) {
  using V = Vec<T, kVecWidth>;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) acc[r][t] = 0.0f;
  auto accumulate = [&](int64_t i, const V (&w)[kRows]) {
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
  };
#pragma unroll
  for (int u = 0; u < kAhead; ++u) {
    const int64_t i = (lane + 32 * u) * static_cast<int64_t>(kVecWidth);
    if (i < k) {
      V w[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) w[r] = have_ahead ? ahead[u][r] : load_vec<T, kVecWidth>(w_row[r] + i);
      accumulate(i, w);
    }
  }
  // Past the lead vectors, kUnroll * kRows vectors a lane in flight (fewer for many rows: registers).
  constexpr int kUnroll = kRows >= 4 ? 1 : 4;
#pragma unroll kUnroll
  for (int64_t i = (lane + 32 * kAhead) * static_cast<int64_t>(kVecWidth); i < k; i += 32 * kVecWidth) {
    V w[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) w[r] = load_vec<T, kVecWidth>(w_row[r] + i);
    accumulate(i, w);
  }
#pragma unroll
  for (int t = 0; t < kMaxTokens; ++t) {
    if (t < num_tokens) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][t] = warp_reduce<SumOp, 32>(acc[r][t]);
    }
  }
}

// ---------------------------------------------------------------- gemv_kernel
// One warp per unit of output features, walked grid-stride: a unit is kRowsPerWarp
// consecutive features (their weight rows' loads all in flight at once: the LM head's
// 49152 rows in fewer, fuller warps), or for the SiLU gate one feature j and its two
// weight rows j and j + n_out. The weight streams once through the warp in 16-byte
// loads, the x rows (at most kMaxTokens) are re-read from L1 (warp_products above).
// A feature's sum runs in the same order whatever kRowsPerWarp is.
//
// kNorm: x is normalised on the fly, xn = round(x * inv_rms * norm_weight), with inv_rms
// = rsqrt(mean(x^2) + eps) per token, reduced by each warp for itself (warp_inv_rms);
// the warp's first weight vectors are requested before it (load_ahead).
//
// Template parameters: T (x, weight, norm_weight) float / __half / __nv_bfloat16; OutT T,
// or float for kEpilogueStore (logits); kVecWidth 1 or 16 / sizeof(T) (the plan picks 16
// bytes only when k, the row strides and the pointers allow it); kMaxTokens 1, 4 or 16
// (registers per lane; num_tokens <= kMaxTokens); kAhead as load_ahead; kRowsPerWarp 1,
// or more for kEpilogueStore and kEpilogueAddResidual.
// Launch contract (cupykern/plans.py::plan_gemv): block kGemvWarps * 32 threads, 1-D grid
// of any size; may be launched as a programmatic dependent launch (its first weight
// vectors are requested before it waits for the kernels before it, pdl.cuh). Mutates
// `out` only.
template <typename T, typename OutT, bool kNorm, int kEpilogue, int kVecWidth, int kMaxTokens, int kAhead,
          int kRowsPerWarp>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(
    OutT* out,                // [num_tokens, n_out], out_row_stride apart
    const T* x,               // [num_tokens, k], x_row_stride apart
    const T* weight,          // [n_out (x2 for kEpilogueSiluAndMul), k], weight_row_stride apart
    const T* norm_weight,     // [k] when kNorm, else unused
    int num_tokens, int64_t k, int64_t n_out, int64_t x_row_stride, int64_t weight_row_stride,
    int64_t out_row_stride, float eps) {
  using V = Vec<T, kVecWidth>;
  constexpr bool kSilu = kEpilogue == kEpilogueSiluAndMul;
  static_assert(!kSilu || kRowsPerWarp == 1, "the SiLU gate takes one feature (two weight rows) per warp");
  constexpr int kRows = kSilu ? 2 : kRowsPerWarp;
  constexpr bool kFastMath = sizeof(T) == 2;  // as activation.cu: intrinsics for 16-bit outputs
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t units = kSilu ? n_out : (n_out + kRowsPerWarp - 1) / kRowsPerWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  // Weight row r of unit u: gate and up rows u and u + n_out, or feature u * kRowsPerWarp + r
  // (past n_out in the last unit: row n_out - 1 again, computed and not stored).
  auto weight_row = [&](int64_t u, int r) -> const T* {
    const int64_t row = kSilu ? u + r * n_out : min(u * kRowsPerWarp + r, n_out - 1);
    return weight + row * weight_row_stride;
  };

  const T* w_row[kRows];
  V ahead[ahead_slots(kAhead)][kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) w_row[r] = weight_row(j, r);
  if (j < units) load_ahead<T, kVecWidth, kRows, kAhead>(ahead, w_row, k, lane);
  start_dependent_part();  // the weights are requested: from here on, x and out (pdl.cuh)

  float inv_rms[kMaxTokens];
  if constexpr (kNorm) {
    if (j < units) warp_inv_rms<T, kVecWidth, kMaxTokens>(inv_rms, x, num_tokens, k, x_row_stride, eps, lane);
  }

  for (bool have_ahead = true; j < units; j += stride, have_ahead = false) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) w_row[r] = weight_row(j, r);
    float acc[kRows][kMaxTokens];
    warp_products<T, kNorm, kRows, kVecWidth, kMaxTokens, kAhead>(acc, w_row, ahead, have_ahead, x, norm_weight,
                                                                  inv_rms, num_tokens, k, x_row_stride, lane);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if constexpr (kSilu) {
        if (t < num_tokens && lane == t % 32) {  // spread the stores over lanes
          OutT* o = out + t * out_row_stride + j;
          *o = from_float<OutT>(silu<kFastMath>(acc[0][t]) * acc[1][t]);
        }
      } else {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int64_t feature = j * kRowsPerWarp + r;
          if (t < num_tokens && lane == (t * kRows + r) % 32 && feature < n_out) {
            OutT* o = out + t * out_row_stride + feature;
            if constexpr (kEpilogue == kEpilogueStore) {
              *o = from_float<OutT>(acc[r][t]);
            } else {
              *o = from_float<OutT>(to_float(*o) + acc[r][t]);
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------- QKV + RoPE + KV append
// rms_norm_gemv_rope_kv_append: the attention half's first launch, as the "no bubbles"
// megakernel's first instruction: xn = round(rms_norm(x)), qkv = xn @ Wqkv^T (q heads,
// then k heads, then v heads, head_dim each), RoPE on the q and k heads, q to
// q_out, k and v to cache row positions[t] (the products rotated in fp32, rounded once). One warp per unit of two output rows, so a
// rotary pair is finished by the warp that computed it:
//   unit u: head h = u / (head_dim / 2), i = u % (head_dim / 2);
//   q or k head, i < rotary_dim / 2: the pair (i, i + rotary_dim / 2) (kIsNeox) or
//     (2i, 2i + 1), rotated by cos/sin row positions[t] of cos_sin_cache:
//     o_a = y_a * c - y_b * s, o_b = y_b * c + y_a * s (fp32 products, one rounding);
//   else: rows rotary_dim + 2m and + 1 (m = i - rotary_dim / 2), or 2i and 2i + 1 for v
//     heads, stored as they are.
// A token whose position is outside [0, num_positions) or [0, cache_rows) writes its q
// unrotated and nothing to the cache (the Python side checks positions unless told not to).
// Launch contract (plans.py::plan_gemv with n_out = units): block kGemvWarps * 32, 1-D
// grid; may be launched as a programmatic dependent launch, as gemv_kernel. Mutates
// q_out, k_cache, v_cache.
template <typename T, typename CacheT, typename IdxT, bool kIsNeox, int kVecWidth, int kMaxTokens, int kAhead>
__global__ void __launch_bounds__(kGemvWarps * 32) rms_norm_gemv_rope_kv_append_kernel(
    T* q_out, T* k_cache, T* v_cache, const T* x, const T* weight, const T* norm_weight, const IdxT* positions,
    const CacheT* cos_sin_cache, int num_tokens, int64_t k, int num_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int64_t x_row_stride, int64_t weight_row_stride, int64_t q_token_stride, int64_t q_head_stride,
    int64_t kc_row_stride, int64_t kc_head_stride, int64_t vc_row_stride, int64_t vc_head_stride,
    int64_t num_positions, int64_t cache_rows, float eps) {
  using V = Vec<T, kVecWidth>;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int half_dim = head_dim / 2, half_rot = rotary_dim / 2;
  const int64_t units = static_cast<int64_t>(num_heads + 2 * num_kv_heads) * half_dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  int64_t u = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;

  // The unit's head, its two rows within the head, and whether they are a rotary pair.
  auto rows_of = [&](int64_t unit, int& head, int& a, int& b, bool& rotary) {
    head = static_cast<int>(unit / half_dim);
    const int i = static_cast<int>(unit - static_cast<int64_t>(head) * half_dim);
    rotary = head < num_heads + num_kv_heads && i < half_rot;
    if (rotary) {
      a = kIsNeox ? i : 2 * i;
      b = kIsNeox ? i + half_rot : 2 * i + 1;
    } else {
      const int base = head < num_heads + num_kv_heads ? rotary_dim + 2 * (i - half_rot) : 2 * i;
      a = base;
      b = base + 1;
    }
  };

  int head, a, b;
  bool rotary;
  rows_of(u, head, a, b, rotary);
  const T* w_row[2] = {weight + (static_cast<int64_t>(head) * head_dim + a) * weight_row_stride,
                       weight + (static_cast<int64_t>(head) * head_dim + b) * weight_row_stride};
  V ahead[ahead_slots(kAhead)][2];
  if (u < units) load_ahead<T, kVecWidth, 2, kAhead>(ahead, w_row, k, lane);
  start_dependent_part();  // the weights are requested: from here on, x, positions and the outputs

  float inv_rms[kMaxTokens];
  if (u < units) warp_inv_rms<T, kVecWidth, kMaxTokens>(inv_rms, x, num_tokens, k, x_row_stride, eps, lane);

  for (bool have_ahead = true; u < units; u += stride, have_ahead = false) {
    rows_of(u, head, a, b, rotary);
    w_row[0] = weight + (static_cast<int64_t>(head) * head_dim + a) * weight_row_stride;
    w_row[1] = weight + (static_cast<int64_t>(head) * head_dim + b) * weight_row_stride;
    float acc[2][kMaxTokens];
    warp_products<T, true, 2, kVecWidth, kMaxTokens, kAhead>(acc, w_row, ahead, have_ahead, x, norm_weight, inv_rms,
                                                             num_tokens, k, x_row_stride, lane);
#pragma unroll
    for (int t = 0; t < kMaxTokens; ++t) {
      if (t < num_tokens && lane == t % 32) {
        // The fp32 products rotated, then rounded once.
        const float ya = acc[0][t], yb = acc[1][t];
        const int64_t p = static_cast<int64_t>(positions[t]);
        const bool in_range = p >= 0 && p < num_positions && p < cache_rows;
        float oa = ya, ob = yb;
        if (rotary && in_range) {
          const int i = kIsNeox ? a : a / 2;
          const float c = to_float(cos_sin_cache[p * rotary_dim + i]);
          const float s = to_float(cos_sin_cache[p * rotary_dim + half_rot + i]);
          oa = ya * c - yb * s;
          ob = yb * c + ya * s;
        }
        T* dst;
        if (head < num_heads) {
          dst = q_out + t * q_token_stride + head * q_head_stride;
        } else if (!in_range) {
          continue;
        } else if (head < num_heads + num_kv_heads) {
          dst = k_cache + p * kc_row_stride + (head - num_heads) * kc_head_stride;
        } else {
          dst = v_cache + p * vc_row_stride + (head - num_heads - num_kv_heads) * vc_head_stride;
        }
        dst[a] = from_float<T>(oa);
        dst[b] = from_float<T>(ob);
      }
    }
  }
}
