// rope.cu: apply_rope, qk_rms_norm_rope.
//
// Math (fp32 from the cache, one rounding to T at the store). For each token with
// position p, cos/sin row c = cache[p, 0:rotary_dim/2], s = cache[p, rotary_dim/2:],
// and each pair (x1, x2) of a head:
//   x1' = x1 * c[i] - x2 * s[i]
//   x2' = x2 * c[i] + x1 * s[i]
// kIsNeox = true pairs (i, i + rotary_dim/2) (GPT-NeoX, Llama in HF layout);
// false pairs (2i, 2i + 1) (GPT-J, llama.cpp GGUF). Dims [rotary_dim, head_dim) are
// not rotated. The cache holds angle p * inv_freq[i], computed in float64 on the host
// (cupykern/rope_scaling.py), so its scaling (linear, NTK, llama3, YaRN with its
// attention factor) is already in c and s.
//   qk_rms_norm_rope: per head, y = x / sqrt(mean(x^2) + eps) * weight over all
//   head_dim dims (fp32 sum of squares), then the rotation above on y; y is kept in
//   fp32 between the two and rounded once.
// Sources: RoFormer, Su et al. 2021 (arXiv:2104.09864); the cos_sin_cache layout and
// the NeoX/GPT-J pairing of vLLM's rotary_embedding kernels and FlashInfer's
// apply_rope_pos_ids_cos_sin_cache; QK-norm as in HF Qwen3/OLMo2/Gemma 3 attention
// (RMSNorm of each head, arXiv:1910.07467, before the rotation).
//
// Layout: q [num_tokens, num_q_heads, head_dim], k [num_tokens, num_kv_heads,
// head_dim] (k may be null: num_kv_heads = 0); unit stride along head_dim, token and
// head strides in elements, passed separately for q, k and the outputs (views of one
// fused QKV buffer work); 64-bit offsets. positions [num_tokens] (int or long long,
// positions_stride apart); cache [max_position, rotary_dim], cache_stride apart.
// Every kernel here takes the sizes and strides as 32-bit ints (each |value|, and q + kv
// heads, below 2^31: checked in Python), widened where they meet a 64-bit index: 64-bit
// ones cost apply_rope 0.06-0.14 us a call at decode sizes (bench/results/NOTES.md, item
// 20) and qk_rms_norm_rope 0.1-0.2 us and 1-3 % at prefill (items 31, 32).
// A token whose position is outside [0, max_position) reads no cache row and is left
// unchanged (apply_rope out of place copies it to the output unrotated).
//
// M-RoPE (apply_rope, kMropeLayout != 0; Qwen2-VL / Qwen2.5-VL / Qwen3-VL): positions
// [3, num_tokens] (temporal, height, width rows, positions_row_stride apart), and the
// row that gives frequency index i in [0, rotary_dim/2) its cos/sin is chosen by the
// sections (mrope_t, mrope_h, mrope_w), which sum to rotary_dim/2:
//   kMropeLayout = 1 (sectioned, HF Qwen2-VL apply_multimodal_rotary_pos_emb, vLLM
//     MRotaryEmbedding): row 0 for i < t, row 1 for t <= i < t + h, row 2 above;
//   kMropeLayout = 2 (interleaved, HF Qwen3-VL apply_interleaved_mrope, vLLM
//     apply_interleaved_rope): row 1 if i % 3 == 1 and i < 3h, row 2 if i % 3 == 2
//     and i < 3w, else row 0.
// c[i] = cache[positions[row(i), token], i], s[i] likewise. A token is rotated only if
// all three of its positions are in range (else it is left as above).
// Mutates: apply_rope writes q_out/k_out (they are q/k in place, where only dims
// [0, rotary_dim) are written; out of place, copy_unrotated = 1 (the wide kernel:
// kInPlace = false) and every dim is written). qk_rms_norm_rope writes every dim of q
// and k in place. Each element is read and written by the same thread, so in-place use
// is race-free.
//
// Work split: a "unit" is kVecWidth pairs of one head: two vectors of kVecWidth
// elements (NeoX: at i and i + rotary_dim/2; GPT-J: 2 * kVecWidth adjacent elements)
// and kVecWidth cos and sin values. A head has units = rotary_dim / 2 / kVecWidth.
// threads_per_head threads share a head (lane = unit index modulo threads_per_head);
// head_slots such groups share a token and walk its num_q_heads + num_kv_heads heads
// (q heads first), so a thread loads its cos/sin once per token and reuses them for
// every head it rotates; tokens_per_block tokens share a block; blocks walk the
// tokens grid-stride.
//
// Template parameters:
//   T                 float, __half, __nv_bfloat16 (q, k, weights)
//   TCache            float, or T
//   TPos              int, long long
//   kIsNeox           true (pairs i, i + rotary_dim/2), false (pairs 2i, 2i+1)
//   kVecWidth         1, 8 / sizeof(T) or 16 / sizeof(T) elements per access (apply_rope);
//                     1 or 16 / sizeof(T) (qk_rms_norm_rope). Every pointer and stride
//                     is aligned to it and rotary_dim/2 and head_dim are multiples of it.
//   kThreadsPerHead   8, 16, 32 (qk_rms_norm_rope: the row group that reduces a head;
//                     the token kernels: the lanes of a head, one unit each); apply_rope's
//                     token kernel also 6 (rotary_dim 96 in 16-bit, at
//                     plans.ROPE_TOKEN_6_LANES_HEADS heads a thread only)
//   kHeadsPerThread   the wide and token kernels' heads a thread holds at once (compiled
//                     for plans.ROPE_WIDE_HEADS_CHOICES / ROPE_WIDE_NORM_HEADS_CHOICES;
//                     apply_rope's token kernel also for plans.ROPE_TOKEN_BAND_HEADS)
//   kMropeLayout      0 (one position per token), 1 (M-RoPE, sectioned), 2 (M-RoPE,
//                     interleaved) (apply_rope; 1 and 2 with kIsNeox = true only)
// Launch contract (planned by cupykern/plans.py::plan_rope): 1-D block of at most
// kRopeMaxBlockSize threads, tokens_per_block * threads_per_head * head_slots of them
// active, rounded up to a multiple of 32; 1-D grid of any size (the token kernels:
// tokens_per_block 1 and exactly num_tokens blocks); no dynamic shared
// memory. qk_rms_norm_rope needs threads_per_head = kThreadsPerHead.
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>

using namespace cupykern;

// Largest block; cupykern/plans.py::ROPE_MAX_BLOCK_SIZE mirrors it.
constexpr int kRopeMaxBlockSize = 256;
// Heads whose loads apply_rope issues before their stores: 32 bytes of q/k per thread
// in flight (two heads of 8-byte vectors, one of 16-byte vectors; two heads of
// 16-byte vectors need more than the 64 registers below and spill).
template <typename T, int kVecWidth>
constexpr int heads_per_step() { return kVecWidth * sizeof(T) >= 16 ? 1 : 2; }
// Blocks of kRopeMaxBlockSize per SM the register budget must allow: 4 x 256 threads
// (64 registers each), meant to keep enough loads in flight to saturate HBM (the
// estimate is in cupykern/plans.py::ROPE_HEADS_PER_THREAD; not yet measured).
constexpr int kRopeMinBlocksPerSm = 4;

// ---------------------------------------------------------------- shared pieces
// Element offsets, inside a head, of the two vectors of unit u.
template <bool kIsNeox, int kVecWidth>
__device__ __forceinline__ void unit_offsets(int64_t u, int64_t half, int64_t& lo, int64_t& hi) {
  if constexpr (kIsNeox) {
    lo = u * kVecWidth;
    hi = half + lo;
  } else {
    lo = 2 * u * kVecWidth;
    hi = lo + kVecWidth;
  }
}

// cos and sin of unit u's kVecWidth angles, widened to fp32, in accesses of at most
// 16 bytes (8 fp32 values take two).
template <typename TCache, int kVecWidth>
__device__ __forceinline__ void load_cos_sin(const TCache* __restrict__ row, int64_t half, int64_t u,
                                             float (&c)[kVecWidth], float (&s)[kVecWidth]) {
  constexpr int kCacheVec = kVecWidth * sizeof(TCache) > 16 ? 16 / sizeof(TCache) : kVecWidth;
#pragma unroll
  for (int part = 0; part < kVecWidth / kCacheVec; ++part) {
    const int64_t i = u * kVecWidth + part * kCacheVec;
    const Vec<TCache, kCacheVec> cv = load_vec<TCache, kCacheVec>(row + i);
    const Vec<TCache, kCacheVec> sv = load_vec<TCache, kCacheVec>(row + half + i);
#pragma unroll
    for (int e = 0; e < kCacheVec; ++e) {
      c[part * kCacheVec + e] = to_float(cv.elt[e]);
      s[part * kCacheVec + e] = to_float(sv.elt[e]);
    }
  }
}

// M-RoPE: which positions row (0 temporal, 1 height, 2 width) gives frequency index i
// its cos/sin (the rule of each layout is in the header). 32-bit: i < rotary_dim / 2.
template <int kMropeLayout>
__device__ __forceinline__ int mrope_row(int i, int mrope_t, int mrope_h, int mrope_w) {
  if constexpr (kMropeLayout == 1) {
    return i < mrope_t ? 0 : (i < mrope_t + mrope_h ? 1 : 2);
  } else {
    const int r = i % 3;
    if (r == 1 && i < 3 * mrope_h) return 1;
    if (r == 2 && i < 3 * mrope_w) return 2;
    return 0;
  }
}

// cos and sin of unit u's kVecWidth angles under M-RoPE: each index from its own row,
// one element at a time (neighbouring indices may come from different rows).
template <typename TCache, int kVecWidth, int kMropeLayout>
__device__ __forceinline__ void load_cos_sin_mrope(const TCache* __restrict__ row0, const TCache* __restrict__ row1,
                                                   const TCache* __restrict__ row2, int64_t half, int64_t u,
                                                   int mrope_t, int mrope_h, int mrope_w,
                                                   float (&c)[kVecWidth], float (&s)[kVecWidth]) {
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) {
    const int64_t i = u * kVecWidth + e;
    const int r = mrope_row<kMropeLayout>(static_cast<int>(i), mrope_t, mrope_h, mrope_w);
    const TCache* row = r == 0 ? row0 : (r == 1 ? row1 : row2);
    c[e] = to_float(row[i]);
    s[e] = to_float(row[half + i]);
  }
}

// Rotates the kVecWidth pairs held in a (first vector) and b (second vector). Pair e
// is (a[e], b[e]) for NeoX; for GPT-J it is elements (2e, 2e + 1) of a followed by b.
template <bool kIsNeox, int kVecWidth>
__device__ __forceinline__ void rotate_pairs(float (&a)[kVecWidth], float (&b)[kVecWidth],
                                             const float (&c)[kVecWidth], const float (&s)[kVecWidth]) {
  float z[2 * kVecWidth];
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) {
    z[e] = a[e];
    z[kVecWidth + e] = b[e];
  }
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) {
    const int i1 = kIsNeox ? e : 2 * e;
    const int i2 = kIsNeox ? kVecWidth + e : 2 * e + 1;
    const float x1 = z[i1], x2 = z[i2];
    // Rounding spelled out: left to the compiler, which product fuses into the FMA
    // differed between kernels holding the same pair (the wide and steps layouts gave
    // different bits for fp32), and the layouts must agree bit for bit.
    z[i1] = __fmaf_rn(x1, c[e], -__fmul_rn(x2, s[e]));
    z[i2] = __fmaf_rn(x2, c[e], __fmul_rn(x1, s[e]));
  }
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) {
    a[e] = z[e];
    b[e] = z[kVecWidth + e];
  }
}

// apply_rope's step for one head's unit: widens the pair vectors to fp32, rotates them
// (rotate_pairs) and stores them rounded at out + lo and out + hi.
template <bool kIsNeox, typename T, int kVecWidth>
__device__ __forceinline__ void rotate_and_store(T* out, int64_t lo, int64_t hi, const Vec<T, kVecWidth>& va,
                                                 const Vec<T, kVecWidth>& vb, const float (&c)[kVecWidth],
                                                 const float (&s)[kVecWidth]) {
  // bf16 pairs widened as 32-bit words (vec.cuh::element): llama-3.1-70b's decode and
  // prefill layouts took 0.09-0.12 us and 1-2 % less, 8b's moved by at most 0.02 us
  // (bench/results/NOTES.md, item 24).
  float a[kVecWidth], b[kVecWidth];
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) {
    a[e] = element(va, e);
    b[e] = element(vb, e);
  }
  rotate_pairs<kIsNeox, kVecWidth>(a, b, c, s);
  store_rounded<T, kVecWidth>(out + lo, a);
  store_rounded<T, kVecWidth>(out + hi, b);
}

// Where the calling thread sits: token tok_sub of the block, head slot, lane in the head.
struct RopeThread {
  int tok_sub, slot, lane;
  __device__ __forceinline__ RopeThread(int threads_per_head, int head_slots) {
    const int threads_per_token = threads_per_head * head_slots;
    tok_sub = threadIdx.x / threads_per_token;
    const int r = threadIdx.x % threads_per_token;
    slot = r / threads_per_head;
    lane = r % threads_per_head;
  }
};

// ---------------------------------------------------------------- apply_rope
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kMropeLayout>
__global__ void __launch_bounds__(kRopeMaxBlockSize, kRopeMinBlocksPerSm) apply_rope_kernel(
    T* q_out,                               // [num_tokens, num_q_heads, head_dim] (q itself in place)
    T* k_out,                               // [num_tokens, num_kv_heads, head_dim] or null
    const T* q,                             // [num_tokens, num_q_heads, head_dim]
    const T* k,                             // [num_tokens, num_kv_heads, head_dim] or null
    const TPos* __restrict__ positions,     // [num_tokens] ([3, num_tokens] for M-RoPE)
    const TCache* __restrict__ cos_sin_cache,  // [max_position, rotary_dim]
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int q_out_token_stride, int q_out_head_stride, int k_out_token_stride,
    int k_out_head_stride, int cache_stride,
    int threads_per_head, int head_slots, int tokens_per_block, int copy_unrotated,
    int positions_row_stride, int mrope_t, int mrope_h, int mrope_w) {  // M-RoPE only
  using V = Vec<T, kVecWidth>;
  constexpr int kHeadsPerStep = heads_per_step<T, kVecWidth>();
  const RopeThread th(threads_per_head, head_slots);
  if (th.tok_sub >= tokens_per_block) return;  // padding up to a whole warp
  const int64_t half = rotary_dim / 2;
  const int64_t units = half / kVecWidth;
  const int64_t pass_vecs = (head_dim - rotary_dim) / kVecWidth;
  const int64_t num_heads = num_q_heads + num_kv_heads;

  for (int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub; token < num_tokens;
       token += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);
    bool valid = pos >= 0 && pos < max_position;
    // M-RoPE: the height and width rows' positions (pos is the temporal row's).
    int64_t pos_h = 0, pos_w = 0;
    if constexpr (kMropeLayout != 0) {
      pos_h = static_cast<int64_t>(positions[token * positions_stride + positions_row_stride]);
      pos_w = static_cast<int64_t>(positions[token * positions_stride + 2 * static_cast<int64_t>(positions_row_stride)]);
      valid = valid && pos_h >= 0 && pos_h < max_position && pos_w >= 0 && pos_w < max_position;
    }
    if (!valid && !copy_unrotated) continue;  // in place: leave the token as it is
    const TCache* cs_row = cos_sin_cache + (valid ? pos : 0) * cache_stride;
    const TCache* cs_row_h = cos_sin_cache + (valid ? pos_h : 0) * cache_stride;
    const TCache* cs_row_w = cos_sin_cache + (valid ? pos_w : 0) * cache_stride;
    const T* q_tok = q + token * q_token_stride;
    const T* k_tok = k + token * k_token_stride;
    T* q_out_tok = q_out + token * q_out_token_stride;
    T* k_out_tok = k_out + token * k_out_token_stride;
    // The head's input and output, q heads first, then k heads.
    auto head_ptrs = [&](int64_t h, const T*& in, T*& out) {
      if (h < num_q_heads) {
        in = q_tok + h * q_head_stride;
        out = q_out_tok + h * q_out_head_stride;
      } else {
        in = k_tok + (h - num_q_heads) * k_head_stride;
        out = k_out_tok + (h - num_q_heads) * k_out_head_stride;
      }
    };

    // Rotate: cos/sin of a unit loaded once, used for every head of this slot. Heads
    // go kHeadsPerStep at a time, all loads before any store, so that more bytes are
    // in flight (the compiler cannot hoist a load above a store that may alias it).
    for (int64_t u = th.lane; u < units; u += threads_per_head) {
      float c[kVecWidth], s[kVecWidth];
      if (valid) {
        if constexpr (kMropeLayout == 0) {
          load_cos_sin<TCache, kVecWidth>(cs_row, half, u, c, s);
        } else {
          load_cos_sin_mrope<TCache, kVecWidth, kMropeLayout>(cs_row, cs_row_h, cs_row_w, half, u, mrope_t, mrope_h,
                                                              mrope_w, c, s);
        }
      }
      int64_t lo, hi;
      unit_offsets<kIsNeox, kVecWidth>(u, half, lo, hi);
      for (int64_t h0 = th.slot; h0 < num_heads; h0 += kHeadsPerStep * head_slots) {
        const T* in[kHeadsPerStep];
        T* out[kHeadsPerStep];
        V va[kHeadsPerStep], vb[kHeadsPerStep];
#pragma unroll
        for (int j = 0; j < kHeadsPerStep; ++j) {
          const int64_t h = h0 + j * head_slots;
          if (h < num_heads) {
            head_ptrs(h, in[j], out[j]);
            va[j] = load_vec<T, kVecWidth>(in[j] + lo);
            vb[j] = load_vec<T, kVecWidth>(in[j] + hi);
          }
        }
#pragma unroll
        for (int j = 0; j < kHeadsPerStep; ++j) {
          if (h0 + j * head_slots >= num_heads) break;
          if (!valid) {  // out of place, bad position: copy unchanged
            store_vec<T, kVecWidth>(out[j] + lo, va[j]);
            store_vec<T, kVecWidth>(out[j] + hi, vb[j]);
            continue;
          }
          rotate_and_store<kIsNeox>(out[j], lo, hi, va[j], vb[j], c, s);
        }
      }
    }
    // Out of place: copy the dims past rotary_dim (in place they are not touched).
    if (copy_unrotated && pass_vecs > 0) {
      for (int64_t h = th.slot; h < num_heads; h += head_slots) {
        const T* in;
        T* out;
        head_ptrs(h, in, out);
        for (int64_t v = th.lane; v < pass_vecs; v += threads_per_head) {
          store_vec<T, kVecWidth>(out + rotary_dim + v * kVecWidth,
                                  load_vec<T, kVecWidth>(in + rotary_dim + v * kVecWidth));
        }
      }
    }
  }
}

// ---------------------------------------------------------------- qk_rms_norm_rope
// A row group of kThreadsPerHead lanes owns one head at a time: it loads the head
// (keeping the lane's first unit and first pass-through vector in registers), reduces
// the sum of squares with warp_reduce, then scales, rotates, rounds and stores. Every
// thread of the block runs the same number of token and head iterations (inactive ones
// with nothing to load), so the shuffles see all 32 lanes. No minimum-blocks bound:
// ptxas needs 48 to 126 registers here and spills when held to 85 (3 blocks per SM).
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead>
__global__ void __launch_bounds__(kRopeMaxBlockSize) qk_rms_norm_rope_kernel(
    T* q,                                   // [num_tokens, num_q_heads, head_dim] in place
    T* k,                                   // [num_tokens, num_kv_heads, head_dim] in place
    const T* __restrict__ q_weight,         // [head_dim]
    const T* __restrict__ k_weight,         // [head_dim]
    const TPos* __restrict__ positions,     // [num_tokens]
    const TCache* __restrict__ cos_sin_cache,  // [max_position, rotary_dim]
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int cache_stride, float eps, int head_slots, int tokens_per_block) {
  using V = Vec<T, kVecWidth>;
  const RopeThread th(kThreadsPerHead, head_slots);
  const int64_t half = rotary_dim / 2;
  const int64_t units = half / kVecWidth;
  const int64_t pass_vecs = (head_dim - rotary_dim) / kVecWidth;
  const int64_t num_heads = num_q_heads + num_kv_heads;
  const int64_t head_iters = (num_heads + head_slots - 1) / head_slots;
  const float inv_head_dim = 1.0f / static_cast<float>(head_dim);

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens;
       base += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    const int64_t pos = in_range ? static_cast<int64_t>(positions[token * positions_stride]) : -1;
    const bool token_ok = pos >= 0 && pos < max_position;
    const TCache* cs_row = cos_sin_cache + (token_ok ? pos : 0) * cache_stride;

    for (int64_t it = 0; it < head_iters; ++it) {
      const int64_t h = th.slot + it * head_slots;
      const bool active = token_ok && h < num_heads;
      const bool is_q = h < num_q_heads;
      T* x = is_q ? q + token * q_token_stride + h * q_head_stride
                  : k + token * k_token_stride + (h - num_q_heads) * k_head_stride;
      const T* w = is_q ? q_weight : k_weight;
      V cache_a[1], cache_b[1], cache_p[1];

      // Pass 1: load (keep the first unit / vector in registers), sum of squares.
      float sumsq = 0.0f;
      for_each_vec<kThreadsPerHead, 1>(active ? units : 0, th.lane, [&](int slot, int64_t u) {
        int64_t lo, hi;
        unit_offsets<kIsNeox, kVecWidth>(u, half, lo, hi);
        const V va = load_vec<T, kVecWidth>(x + lo);
        const V vb = load_vec<T, kVecWidth>(x + hi);
        if (slot >= 0) {
          cache_a[0] = va;
          cache_b[0] = vb;
        }
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) {
          sumsq = __fmaf_rn(to_float(va.elt[e]), to_float(va.elt[e]), sumsq);
          sumsq = __fmaf_rn(to_float(vb.elt[e]), to_float(vb.elt[e]), sumsq);
        }
      });
      for_each_vec<kThreadsPerHead, 1>(active ? pass_vecs : 0, th.lane, [&](int slot, int64_t v) {
        const V vp = load_vec<T, kVecWidth>(x + rotary_dim + v * kVecWidth);
        if (slot >= 0) cache_p[0] = vp;
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) sumsq = __fmaf_rn(to_float(vp.elt[e]), to_float(vp.elt[e]), sumsq);
      });
      sumsq = warp_reduce<SumOp, kThreadsPerHead>(sumsq);
      const float inv_rms = rsqrtf(sumsq * inv_head_dim + eps);

      // Pass 2: normalise and weight in fp32, rotate, round once, store.
      for_each_vec<kThreadsPerHead, 1>(active ? units : 0, th.lane, [&](int slot, int64_t u) {
        int64_t lo, hi;
        unit_offsets<kIsNeox, kVecWidth>(u, half, lo, hi);
        const V va = slot >= 0 ? cache_a[0] : load_vec<T, kVecWidth>(x + lo);
        const V vb = slot >= 0 ? cache_b[0] : load_vec<T, kVecWidth>(x + hi);
        const V wa = load_vec<T, kVecWidth>(w + lo);
        const V wb = load_vec<T, kVecWidth>(w + hi);
        float a[kVecWidth], b[kVecWidth], c[kVecWidth], s[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) {
          a[e] = to_float(va.elt[e]) * inv_rms * to_float(wa.elt[e]);
          b[e] = to_float(vb.elt[e]) * inv_rms * to_float(wb.elt[e]);
        }
        load_cos_sin<TCache, kVecWidth>(cs_row, half, u, c, s);
        rotate_pairs<kIsNeox, kVecWidth>(a, b, c, s);
        store_rounded<T, kVecWidth>(x + lo, a);
        store_rounded<T, kVecWidth>(x + hi, b);
      });
      for_each_vec<kThreadsPerHead, 1>(active ? pass_vecs : 0, th.lane, [&](int slot, int64_t v) {
        const int64_t i = rotary_dim + v * kVecWidth;
        const V vp = slot >= 0 ? cache_p[0] : load_vec<T, kVecWidth>(x + i);
        const V wp = load_vec<T, kVecWidth>(w + i);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = to_float(vp.elt[e]) * inv_rms * to_float(wp.elt[e]);
        store_rounded<T, kVecWidth>(x + i, y);
      });
    }
  }
}

// ---------------------------------------------------------------- wide layout
// apply_rope_wide_kernel and qk_rms_norm_rope_wide_kernel split the work as the kernels
// above (a thread owns unit `lane` of every head_slots-th head of its slot), but hold
// kHeadsPerThread heads at once: every q/k vector of those heads is requested before the
// token's position is waited on, then the cos/sin of the unit is loaded once and used
// for all of them, then they are stored. The kernels above rotate one head (16-byte
// vectors) or two (8-byte) between stores, so a thread walking 4 heads waited out
// position -> cos/sin -> 4 x (q/k load -> store) per token, with 32 bytes in flight; here
// it is position -> cos/sin, with the q/k loads (up to 160 bytes a thread for apply_rope,
// 192 for qk_rms_norm_rope) overlapping that chain. Same per-element expressions (rotate_pairs, the same sum-of-squares order
// and row group), so the bits are those of the kernels above.
// Launch contract as above, narrower (cupykern/plans.py::plan_rope keeps it): one round
// of heads a token (kHeadsPerThread * head_slots >= num_q_heads + num_kv_heads), and
// apply_rope_wide_kernel one unit a lane (threads_per_head = rotary_dim / 2 / kVecWidth).
//
// Blocks of kRopeMaxBlockSize per SM apply_rope_wide_kernel's register budget allows:
// ptxas needs 80-125 registers for 3 to 5 heads of two 16-byte vectors (2 blocks: up to
// 80 KB of q/k in flight per SM; 3 heads spilled at 85), 80 for 2 heads (3 blocks).
// M-RoPE's element-wise cos/sin spill at 85 registers even with 2 heads: 2 blocks there
// too, and 1 with 5 heads (the interleaved layout spilled at 128 registers).
template <int kHeadsPerThread, int kMropeLayout>
constexpr int rope_wide_min_blocks() {
  if (kMropeLayout != 0) return kHeadsPerThread >= 5 ? 1 : 2;
  return kHeadsPerThread >= 3 ? 2 : 3;
}

// kHeadsPerThread: heads a thread holds at once (cupykern/plans.py::ROPE_WIDE_HEADS_CHOICES).
// kInPlace: q_out is q and k_out is k, with their strides (apply_rope(inplace=True); the
// out arguments are then not read; copy_unrotated never is, kInPlace stands for it).
// Its own instantiation: the output addresses are the input ones, and the out-of-place
// branches (the invalid token's copy, the pass-through dims) are not compiled. With the
// head index in 32 bits, llama-3.1-8b / -70b bf16 in place took 3.1 / 2.6 % less at
// 16384 tokens and 0.08-0.15 us less at 1-64 tokens, within 0.6 / 1.5 % of a
// hand-written kernel of the same structure (bench/results/NOTES.md, item 30).
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kMropeLayout,
          int kHeadsPerThread, bool kInPlace>
__global__ void __launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks<kHeadsPerThread, kMropeLayout>()) apply_rope_wide_kernel(
    T* q_out, T* k_out, const T* q, const T* k,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int q_out_token_stride, int q_out_head_stride, int k_out_token_stride,
    int k_out_head_stride, int cache_stride,
    int threads_per_head, int head_slots, int tokens_per_block,
    int copy_unrotated,  // the steps kernel's argument; kInPlace says it here
    int positions_row_stride, int mrope_t, int mrope_h, int mrope_w) {
  using V = Vec<T, kVecWidth>;
  constexpr int kMaxHeads = kHeadsPerThread;
  const RopeThread th(threads_per_head, head_slots);
  if (th.tok_sub >= tokens_per_block) return;  // padding up to a whole warp
  const int64_t half = rotary_dim / 2;
  const int64_t pass_vecs = (head_dim - rotary_dim) / kVecWidth;
  const int num_heads = num_q_heads + num_kv_heads;
  int64_t lo, hi;
  unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo, hi);

  for (int64_t token = static_cast<int64_t>(blockIdx.x) * tokens_per_block + th.tok_sub; token < num_tokens;
       token += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);
    int64_t pos_h = 0, pos_w = 0;
    if constexpr (kMropeLayout != 0) {
      pos_h = static_cast<int64_t>(positions[token * positions_stride + positions_row_stride]);
      pos_w = static_cast<int64_t>(positions[token * positions_stride + 2 * static_cast<int64_t>(positions_row_stride)]);
    }
    const T* q_tok = q + token * q_token_stride;
    const T* k_tok = k + token * k_token_stride;
    T* q_out_tok = q_out + token * q_out_token_stride;
    T* k_out_tok = k_out + token * k_out_token_stride;

    // Head h's input and output (h < num_q_heads + num_kv_heads < 2^31, checked in
    // Python). In place the output is the input: q and k are declared const only
    // because the out-of-place instantiation reads them.
    auto head_in = [&](int h) -> const T* {
      return h < num_q_heads ? q_tok + static_cast<int64_t>(h) * q_head_stride
                             : k_tok + static_cast<int64_t>(h - num_q_heads) * k_head_stride;
    };
    auto head_out = [&](int h) -> T* {
      if constexpr (kInPlace) return const_cast<T*>(head_in(h));
      return h < num_q_heads ? q_out_tok + static_cast<int64_t>(h) * q_out_head_stride
                             : k_out_tok + static_cast<int64_t>(h - num_q_heads) * k_out_head_stride;
    };

    // One unit a lane, every head of the token in this one round (launch contract):
    // loops over units and over rounds of heads here, even of one iteration each, took
    // llama-3.1-8b at 4096 tokens from 25.0 to 34.5 us, either one alone to 26.6-26.9
    // (bench/results/NOTES.md, item 17).
    V va[kMaxHeads], vb[kMaxHeads];
#pragma unroll
    for (int j = 0; j < kMaxHeads; ++j) {
      const int h = th.slot + j * head_slots;
      if (h < num_heads) {
        const T* in = head_in(h);
        va[j] = load_vec<T, kVecWidth>(in + lo);
        vb[j] = load_vec<T, kVecWidth>(in + hi);
      }
    }
    bool valid = pos >= 0 && pos < max_position;
    if constexpr (kMropeLayout != 0) {
      valid = valid && pos_h >= 0 && pos_h < max_position && pos_w >= 0 && pos_w < max_position;
    }
    float c[kVecWidth], s[kVecWidth];
    if (valid) {
      const TCache* cs_row = cos_sin_cache + pos * cache_stride;
      if constexpr (kMropeLayout == 0) {
        load_cos_sin<TCache, kVecWidth>(cs_row, half, th.lane, c, s);
      } else {
        load_cos_sin_mrope<TCache, kVecWidth, kMropeLayout>(cs_row, cos_sin_cache + pos_h * cache_stride,
                                                            cos_sin_cache + pos_w * cache_stride, half, th.lane,
                                                            mrope_t, mrope_h, mrope_w, c, s);
      }
    }
    if constexpr (kInPlace) {
      if (!valid) continue;  // the token is left as it is
    }
#pragma unroll
    for (int j = 0; j < kMaxHeads; ++j) {
      const int h = th.slot + j * head_slots;
      if (h >= num_heads) break;
      T* out = head_out(h);
      if constexpr (!kInPlace) {
        if (!valid) {  // copied unchanged
          store_vec<T, kVecWidth>(out + lo, va[j]);
          store_vec<T, kVecWidth>(out + hi, vb[j]);
          continue;
        }
      }
      rotate_and_store<kIsNeox>(out, lo, hi, va[j], vb[j], c, s);
    }
    // Out of place: copy the dims past rotary_dim (in place they are not touched). Its
    // addresses spelled out as when item 30 timed it: head_in / head_out here changed
    // the out-of-place machine code (not timed).
    if (!kInPlace && pass_vecs > 0) {
      for (int64_t h = th.slot; h < num_heads; h += head_slots) {
        const bool is_q = h < num_q_heads;
        const T* in = is_q ? q_tok + h * q_head_stride : k_tok + (h - num_q_heads) * k_head_stride;
        T* out = is_q ? q_out_tok + h * q_out_head_stride : k_out_tok + (h - num_q_heads) * k_out_head_stride;
        for (int64_t v = th.lane; v < pass_vecs; v += threads_per_head) {
          store_vec<T, kVecWidth>(out + rotary_dim + v * kVecWidth,
                                  load_vec<T, kVecWidth>(in + rotary_dim + v * kVecWidth));
        }
      }
    }
  }
}

// apply_rope, token kernel: apply_rope_wide_kernel's in-place work and per-element
// expressions (so its bits) for shapes every thread fills, without its token loop and
// guards, as qk_rms_norm_rope_token_kernel below. Launch contract (plans.py::plan_rope
// checks it): in place (q_out is q and k_out is k, with their strides), one position a
// token (no M-RoPE), block = head_slots * kThreadsPerHead threads exactly (a multiple of
// 32), num_q_heads + num_kv_heads = head_slots * kHeadsPerThread, rotary_dim = 2 *
// kThreadsPerHead * kVecWidth (every lane holds one unit of every head it walks; dims past
// rotary_dim are not touched), tokens_per_block 1 and exactly num_tokens blocks (block b is
// token b); same signature as the wide kernel. It reads and writes through q_out and k_out
// with their strides (in place, q and k's; unlike the wide kernel's in-place build, which
// goes through q and k), and reads neither q, k and their strides nor copy_unrotated and
// the M-RoPE arguments. A token out of range gets its q/k values written back as they
// were (the same bytes), and its whole block returns.
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead,
          int kHeadsPerThread>
__global__ void __launch_bounds__(kRopeMaxBlockSize) apply_rope_token_kernel(
    T* q_out, T* k_out, const T* q, const T* k,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int q_out_token_stride, int q_out_head_stride, int k_out_token_stride,
    int k_out_head_stride, int cache_stride,
    int threads_per_head, int head_slots, int tokens_per_block, int copy_unrotated,
    int positions_row_stride, int mrope_t, int mrope_h, int mrope_w) {
  using V = Vec<T, kVecWidth>;
  const int lane = threadIdx.x % kThreadsPerHead;
  const int slot = threadIdx.x / kThreadsPerHead;
  const int64_t token = blockIdx.x;
  const int half = rotary_dim / 2;
  int lo, hi;
  {
    int64_t lo64, hi64;
    unit_offsets<kIsNeox, kVecWidth>(lane, half, lo64, hi64);
    lo = static_cast<int>(lo64);
    hi = static_cast<int>(hi64);
  }
  // Requested first, waited on only after the token's q/k loads are in flight (below).
  const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);
  auto head_ptr = [&](int h) -> T* {
    return h < num_q_heads ? q_out + token * q_out_token_stride + static_cast<int64_t>(h) * q_out_head_stride
                           : k_out + token * k_out_token_stride + static_cast<int64_t>(h - num_q_heads) * k_out_head_stride;
  };
  V va[kHeadsPerThread], vb[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const T* x = head_ptr(slot + j * head_slots);
    va[j] = load_vec<T, kVecWidth>(x + lo);
    vb[j] = load_vec<T, kVecWidth>(x + hi);
  }
  // Out of range, the token's values are written back as they were: with a plain return
  // the loads, dead on that path, were sunk below the check by ptxas, so issued only once
  // the position had arrived: 0.9-6.8 % of the kernel's time on the H200
  // (bench/results/NOTES.md item 59; tests/test_rope_layouts.py reads the order in the
  // SASS). The fence keeps the compiler from dropping the write-back as a store of the
  // value just loaded from the same place.
  loads_issued_here();
  if (pos < 0 || pos >= max_position) {
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      T* x = head_ptr(slot + j * head_slots);
      store_vec<T, kVecWidth>(x + lo, va[j]);
      store_vec<T, kVecWidth>(x + hi, vb[j]);
    }
    return;
  }
  float c[kVecWidth], s[kVecWidth];
  load_cos_sin<TCache, kVecWidth>(cos_sin_cache + pos * cache_stride, half, lane, c, s);
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    rotate_and_store<kIsNeox>(head_ptr(slot + j * head_slots), lo, hi, va[j], vb[j], c, s);
  }
}

// Blocks of kRopeMaxBlockSize per SM qk_rms_norm_rope_wide_kernel's register budget
// allows (128 registers): ptxas needs 90-128 for 2 to 5 heads of 16-byte vectors since the
// 32-bit sizes (item 32; 5 heads spilled 88 bytes at 128 before) and spills none of them
// in 16-bit (it does at 80: 3 blocks); fp32's 5 heads with pass-through dims spill 20-80
// bytes and are never planned (plans.py::ROPE_WIDE_NORM_FP32_MOST_HEADS). The occupancy
// API's count of blocks an SM sizes the grid.
constexpr int kQkWideMinBlocksPerSm = 2;

// qk_rms_norm_rope, wide: needs units <= kThreadsPerHead and pass-through vectors <=
// kThreadsPerHead (each lane holds at most one unit and one pass-through vector of a
// head; cupykern/plans.py::plan_rope checks it), so a lane's sum of squares is its
// unit's then its pass-through vector's, in the order of the kernel above. Every head of
// a token in one round (kHeadsPerThread * head_slots >= num_q_heads + num_kv_heads), as
// apply_rope_wide_kernel. All threads run the same token iterations for the shuffles.
// kHasPass: head_dim > rotary_dim. Its own instantiation, as apply_rope_wide_kernel's
// kInPlace: without it a full-rotary call kept the pass-through registers and branches.
// Sizes, strides and head indices in 32 bits (token offsets in 64), as apply_rope's
// kernels. The lane's weight vectors are loaded beside each head's stores: held across
// the token walk they took a 64-byte stack frame (`is_q ? wqa : wka` bound a reference to
// one of two). The three together, against the kernel before them (same bits): with
// rotary_dim = head_dim 0.4-0.5 us less at 1-64 tokens and 3-11 % at 4096-16384; with
// rotary_dim 64 of 128 2 % and 10-12 % (bench/results/NOTES.md, item 32).
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead,
          int kHeadsPerThread, bool kHasPass>
__global__ void __launch_bounds__(kRopeMaxBlockSize, kQkWideMinBlocksPerSm) qk_rms_norm_rope_wide_kernel(
    T* q, T* k, const T* __restrict__ q_weight, const T* __restrict__ k_weight,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int cache_stride, float eps, int head_slots, int tokens_per_block) {
  using V = Vec<T, kVecWidth>;
  const RopeThread th(kThreadsPerHead, head_slots);
  const int half = rotary_dim / 2;
  const int num_heads = num_q_heads + num_kv_heads;
  const float inv_head_dim = 1.0f / static_cast<float>(head_dim);
  const bool has_unit = th.lane < half / kVecWidth;
  const bool has_pass = kHasPass && th.lane < (head_dim - rotary_dim) / kVecWidth;
  int lo, hi;
  {
    int64_t lo64, hi64;
    unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo64, hi64);
    lo = static_cast<int>(lo64);
    hi = static_cast<int>(hi64);
  }
  const int p_off = rotary_dim + th.lane * kVecWidth;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens;
       base += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = in_range ? static_cast<int64_t>(positions[token * positions_stride]) : -1;
    auto head_ptr = [&](int h) -> T* {
      return h < num_q_heads ? q + token * q_token_stride + static_cast<int64_t>(h) * q_head_stride
                             : k + token * k_token_stride + static_cast<int64_t>(h - num_q_heads) * k_head_stride;
    };
    V xa[kHeadsPerThread], xb[kHeadsPerThread], xp[kHeadsPerThread];
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      const int h = th.slot + j * head_slots;
      if (in_range && h < num_heads) {
        const T* x = head_ptr(h);
        if (has_unit) {
          xa[j] = load_vec<T, kVecWidth>(x + lo);
          xb[j] = load_vec<T, kVecWidth>(x + hi);
        }
        if (has_pass) xp[j] = load_vec<T, kVecWidth>(x + p_off);
      }
    }
    const bool token_ok = pos >= 0 && pos < max_position;
    float c[kVecWidth], s[kVecWidth];
    if (token_ok && has_unit) load_cos_sin<TCache, kVecWidth>(cos_sin_cache + pos * cache_stride, half, th.lane, c, s);
    float inv_rms[kHeadsPerThread];
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      const bool active = token_ok && th.slot + j * head_slots < num_heads;
      float sumsq = 0.0f;
      if (active && has_unit) {
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) {
          sumsq = __fmaf_rn(to_float(xa[j].elt[e]), to_float(xa[j].elt[e]), sumsq);
          sumsq = __fmaf_rn(to_float(xb[j].elt[e]), to_float(xb[j].elt[e]), sumsq);
        }
      }
      if (active && has_pass) {
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) sumsq = __fmaf_rn(to_float(xp[j].elt[e]), to_float(xp[j].elt[e]), sumsq);
      }
      sumsq = warp_reduce<SumOp, kThreadsPerHead>(sumsq);
      inv_rms[j] = rsqrtf(sumsq * inv_head_dim + eps);
    }
    if (!token_ok) continue;  // the token is left as it is (uniform over its row groups)
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      const int h = th.slot + j * head_slots;
      if (h >= num_heads) break;
      const T* w = h < num_q_heads ? q_weight : k_weight;
      T* x = head_ptr(h);
      if (has_unit) {
        const V wa = load_vec<T, kVecWidth>(w + lo);
        const V wb = load_vec<T, kVecWidth>(w + hi);
        float a[kVecWidth], b[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) {
          a[e] = to_float(xa[j].elt[e]) * inv_rms[j] * to_float(wa.elt[e]);
          b[e] = to_float(xb[j].elt[e]) * inv_rms[j] * to_float(wb.elt[e]);
        }
        rotate_pairs<kIsNeox, kVecWidth>(a, b, c, s);
        store_rounded<T, kVecWidth>(x + lo, a);
        store_rounded<T, kVecWidth>(x + hi, b);
      }
      if (has_pass) {
        const V wp = load_vec<T, kVecWidth>(w + p_off);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = to_float(xp[j].elt[e]) * inv_rms[j] * to_float(wp.elt[e]);
        store_rounded<T, kVecWidth>(x + p_off, y);
      }
    }
  }
}

// qk_rms_norm_rope, token kernel: the wide kernel's work split, per-element expressions
// and order of the sum of squares (so its bits: full rotary, no pass-through dims), for
// shapes every thread fills, without the wide kernel's token loop and guards. Launch
// contract (plans.py::plan_rope checks it): block = head_slots * kThreadsPerHead threads
// exactly (a multiple of 32), num_q_heads + num_kv_heads = head_slots * kHeadsPerThread,
// rotary_dim = head_dim = 2 * kThreadsPerHead * kVecWidth (every lane holds one unit of
// every head it walks), tokens_per_block 1 and exactly num_tokens blocks (block b is token
// b); same signature as the wide kernel. Lane and slot come from kThreadsPerHead at
// compile time, each head is reduced, scaled, rotated and stored in turn, 16-bit elements
// are widened with element(), and a token out of range returns with its whole block after
// its q/k loads were requested. Its guards (a slot past head_slots, a head past num_heads,
// a lane without a unit) took it from 816 to 1368 instructions in sm_90 SASS for bf16's 5
// heads a thread, 25 of them divergent regions, and 5-9 % of the time. Against the wide
// kernel, bf16: 8b 11.7 / 6.0 / 5.5 % less at 1024 / 4096 / 16384 tokens, 70b 12 / 6 / 3 %
// (bench/results/NOTES.md, item 38, calls E and J); at 1-64 tokens 18-22 % (item 39, call B).
//
// Registers a thread by heads a thread (__maxnreg__; __launch_bounds__ cannot ask for 96
// with 256-thread blocks). ptxas takes the cap as its budget, and a free build is no better:
// 5 heads (llama-3.1-8b) 96 (95 free, same time; 88 level, 80 10-11 % slower); 3 heads
// (-70b) 88, which it fills with 80 (92 under 96: 3 blocks of 192 threads an SM where 80
// leave 4; 96 took 8-9 % longer at 1024-16384 tokens); 2 heads (8b at decode sizes) 80,
// which it fills with 78 (51 free took 0.3 us longer at 1-64 tokens, 88 under 96 0.03 us).
// Measured on the H200, bf16 (item 39, call C). 4 heads (not planned by default, untimed)
// 96: under 88, 32 lanes with a bf16 cache spilled 8 bytes (helper 60).
template <int kHeadsPerThread>
constexpr int qk_token_max_registers() {
  return kHeadsPerThread >= 4 ? 96 : (kHeadsPerThread == 3 ? 88 : 80);
}
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead,
          int kHeadsPerThread>
__global__ void __maxnreg__(qk_token_max_registers<kHeadsPerThread>()) qk_rms_norm_rope_token_kernel(
    T* q, T* k, const T* __restrict__ q_weight, const T* __restrict__ k_weight,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int num_tokens, int num_q_heads, int num_kv_heads, int head_dim,
    int rotary_dim, int max_position, int positions_stride,
    int q_token_stride, int q_head_stride, int k_token_stride, int k_head_stride,
    int cache_stride, float eps, int head_slots, int tokens_per_block) {
  using V = Vec<T, kVecWidth>;
  const int lane = threadIdx.x % kThreadsPerHead;
  const int slot = threadIdx.x / kThreadsPerHead;
  const int64_t token = blockIdx.x;
  const int half = rotary_dim / 2;
  const float inv_head_dim = 1.0f / static_cast<float>(head_dim);
  int lo, hi;
  {
    int64_t lo64, hi64;
    unit_offsets<kIsNeox, kVecWidth>(lane, half, lo64, hi64);
    lo = static_cast<int>(lo64);
    hi = static_cast<int>(hi64);
  }
  // Requested first; the q/k loads wait on it (the return below says why).
  const int64_t pos = static_cast<int64_t>(positions[token * positions_stride]);
  auto head_ptr = [&](int h) -> T* {
    return h < num_q_heads ? q + token * q_token_stride + static_cast<int64_t>(h) * q_head_stride
                           : k + token * k_token_stride + static_cast<int64_t>(h - num_q_heads) * k_head_stride;
  };
  V xa[kHeadsPerThread], xb[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const T* x = head_ptr(slot + j * head_slots);
    xa[j] = load_vec<T, kVecWidth>(x + lo);
    xb[j] = load_vec<T, kVecWidth>(x + hi);
  }
  // A plain return, and ptxas sinks the q/k loads below it (behind the position's load).
  // Writing the token back as apply_rope_token_kernel does keeps them first, but here it
  // took 8b's 5 heads 1.4-2.6 % longer on the H200 at 528-3900 tokens and 70b up to 7.5 %
  // at all but 16384, for 3-4 % less at 8b's 1-64 tokens (under this kernel's register
  // cap; bench/results/NOTES.md item 59).
  if (pos < 0 || pos >= max_position) return;  // the token is left as it is (the whole block)
  float c[kVecWidth], s[kVecWidth];
  load_cos_sin<TCache, kVecWidth>(cos_sin_cache + pos * cache_stride, half, lane, c, s);
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const int h = slot + j * head_slots;
    float sumsq = 0.0f;
#pragma unroll
    for (int e = 0; e < kVecWidth; ++e) {
      sumsq = __fmaf_rn(element(xa[j], e), element(xa[j], e), sumsq);
      sumsq = __fmaf_rn(element(xb[j], e), element(xb[j], e), sumsq);
    }
    sumsq = warp_reduce<SumOp, kThreadsPerHead>(sumsq);
    const float inv_rms = rsqrtf(sumsq * inv_head_dim + eps);
    const T* w = h < num_q_heads ? q_weight : k_weight;
    const V wa = load_vec<T, kVecWidth>(w + lo);
    const V wb = load_vec<T, kVecWidth>(w + hi);
    float a[kVecWidth], b[kVecWidth];
#pragma unroll
    for (int e = 0; e < kVecWidth; ++e) {
      a[e] = element(xa[j], e) * inv_rms * element(wa, e);
      b[e] = element(xb[j], e) * inv_rms * element(wb, e);
    }
    rotate_pairs<kIsNeox, kVecWidth>(a, b, c, s);
    T* x = head_ptr(h);
    store_rounded<T, kVecWidth>(x + lo, a);
    store_rounded<T, kVecWidth>(x + hi, b);
  }
}
