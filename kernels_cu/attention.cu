// attention.cu: the KV-cache side of a decode step, and a prompt's attention.
//   rope_kv_append_kernel    RoPE on q (in place) and k; k and v written to the cache row
//                            of each token's position (read from device memory)
//   decode_attention_kernel  softmax(q k^T * scale) v over cache rows [0, position] for
//                            grouped-query heads, split over the cache (flash-decoding):
//                            one split writes the output, more write partials ...
//   attention_combine_kernel ... that this kernel merges
//   prefill_attention_kernel the same attention for many query tokens at once (a
//                            prompt's prefill): blocks of query rows share each K/V tile
//                            they load (flash-attention), warps split the keys
//
// Part of the decode kernels (gemv.cu, attention.cu, tokens.cu): each can run inside a
// captured CUDA graph, since every size it needs from the sequence (position, length) is
// read from device memory, so a replay needs no new kernel arguments; and each (but
// prefill_attention_kernel) may be launched as a programmatic dependent launch (pdl.cuh:
// it waits for the kernels before it before it reads or writes anything they touch).
//
// Sources: RoPE, Su et al. 2021 (arXiv:2104.09864), vLLM's cos_sin_cache layout ([cos |
// sin] per position, rotary_dim values) and its rotary_embedding + reshape_and_cache pair;
// split-KV decoding, Dao et al., "Flash-Decoding for long-context inference" (2023);
// tiled attention, Dao et al., "FlashAttention" (2022, arXiv:2205.14135); the online
// softmax, Milakov & Gimelshein 2018 (arXiv:1805.02867); grouped-query attention,
// Ainslie et al. 2023 (arXiv:2305.13245).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/pdl.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- RoPE + KV append
// One block per token (blockIdx.x = t), threads over heads x pairs. For the token at
// position p = positions[t] (skipped whole when p is outside [0, num_positions) or
// [0, cache_rows): the Python side checks positions unless told not to):
//   q[t, h] rotated in place (pairs (i, i + rotary_dim/2) when kIsNeox, else (2i, 2i+1));
//   k_cache[p, h] = rotate(k[t, h]), v_cache[p, h] = v[t, h]; dims past rotary_dim copied.
// cos_sin_cache: [num_positions, rotary_dim], cos then sin (CacheT float or T).
// Mutates q, k_cache, v_cache. k and v are read only (they may be views of a fused QKV
// buffer beside q).
template <typename T, typename CacheT, typename IdxT, bool kIsNeox>
__global__ void __launch_bounds__(256) rope_kv_append_kernel(
    T* q, T* k_cache, T* v_cache, const T* k, const T* v, const IdxT* positions, const CacheT* cos_sin_cache,
    int num_heads, int num_kv_heads, int head_dim, int rotary_dim,
    int64_t q_token_stride, int64_t q_head_stride, int64_t k_token_stride, int64_t k_head_stride,
    int64_t v_token_stride, int64_t v_head_stride, int64_t kc_row_stride, int64_t kc_head_stride,
    int64_t vc_row_stride, int64_t vc_head_stride, int64_t num_positions, int64_t cache_rows) {
  start_dependent_part();  // pdl.cuh: nothing here is independent of earlier kernels
  const int t = blockIdx.x;
  const int64_t p = static_cast<int64_t>(positions[t]);
  if (p < 0 || p >= num_positions || p >= cache_rows) return;
  const int half = rotary_dim / 2;
  const CacheT* cos = cos_sin_cache + p * rotary_dim;
  const CacheT* sin = cos + half;

  // q: each thread rotates whole pairs in place (both elements read before either is written).
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx - h * half;
    T* row = q + t * q_token_stride + h * q_head_stride;
    const int a = kIsNeox ? i : 2 * i, b = kIsNeox ? i + half : 2 * i + 1;
    const float x0 = to_float(row[a]), x1 = to_float(row[b]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    row[a] = from_float<T>(x0 * c - x1 * s);
    row[b] = from_float<T>(x1 * c + x0 * s);
  }
  // k and v: one output element per thread, into the cache row of position p.
  for (int idx = threadIdx.x; idx < num_kv_heads * head_dim; idx += blockDim.x) {
    const int h = idx / head_dim, d = idx - h * head_dim;
    const T* k_row = k + t * k_token_stride + h * k_head_stride;
    float y = to_float(k_row[d]);
    if (d < rotary_dim) {
      int i, partner;
      bool first;
      if (kIsNeox) {
        first = d < half;
        i = first ? d : d - half;
        partner = first ? d + half : d - half;
      } else {
        first = (d & 1) == 0;
        i = d >> 1;
        partner = first ? d + 1 : d - 1;
      }
      const float c = to_float(cos[i]), s = to_float(sin[i]);
      const float other = to_float(k_row[partner]);
      y = first ? y * c - other * s : y * c + other * s;
    }
    k_cache[p * kc_row_stride + h * kc_head_stride + d] = from_float<T>(y);
    v_cache[p * vc_row_stride + h * vc_head_stride + d] = v[t * v_token_stride + h * v_head_stride + d];
  }
}

// ---------------------------------------------------------------- decode attention

// Online-softmax state of one lane group: running max m (base-2 logits), sum l, and the
// lane's kVec accumulated output dims.
template <int kVec>
struct SoftmaxState {
  float m, l, acc[kVec];
};

// Merges state b into a (both in base-2 units). Empty states have m = -inf, l = 0.
template <int kVec>
__device__ __forceinline__ void merge_state(SoftmaxState<kVec>& a, const SoftmaxState<kVec>& b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -positive_infinity()) return;  // both empty
  const float ca = exp2f(a.m - m), cb = exp2f(b.m - m);
  a.l = a.l * ca + b.l * cb;
#pragma unroll
  for (int e = 0; e < kVec; ++e) a.acc[e] = a.acc[e] * ca + b.acc[e] * cb;
  a.m = m;
}

// Grid (num_heads, num_tokens, num_splits), block kAttnWarps * 32 (plans.py::ATTENTION_WARPS,
// a template parameter so benchmarks can try others). Query head h of token t attends to cache rows [0, positions[t]] of kv head h / group (grouped-query attention),
// split s covering rows [s * split_size, (s + 1) * split_size). A lane group of
// kHeadDim / kVec lanes holds one cache row (16-byte vectors); a warp takes 32 / (kHeadDim
// / kVec) rows at a time, each warp strides by kAttnWarps such batches. States merge in a
// fixed order: lane groups by a butterfly, then the warps' states, weighted and summed in
// warp order through shared memory.
// kSplit false (one split): out[t, h] = round(sum_p softmax_p v_p). kSplit true: the
// split's normalised output and its log2-sum-exp go to partial_out / partial_lse for
// attention_combine_kernel. Positions past cache_rows are clamped to the cache; a
// negative position attends to nothing (output 0).
// Mutates out (or the partials) only.
template <typename T, typename IdxT, int kHeadDim, bool kSplit, int kAttnWarps>
__global__ void __launch_bounds__(kAttnWarps * 32) decode_attention_kernel(
    T* out, float* partial_out, float* partial_lse, const T* q, const T* k_cache, const T* v_cache,
    const IdxT* positions, int group, int64_t q_token_stride, int64_t q_head_stride, int64_t kc_row_stride,
    int64_t kc_head_stride, int64_t vc_row_stride, int64_t vc_head_stride, int64_t out_token_stride,
    int64_t out_head_stride, int64_t cache_rows, int64_t split_size, float scale_log2) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kLanesPerRow = kHeadDim / kVec;
  static_assert(kLanesPerRow >= 1 && kLanesPerRow <= 32 && 32 % kLanesPerRow == 0, "head_dim / vector mismatch");
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  using V = Vec<T, kVec>;
  const int h = blockIdx.x, t = blockIdx.y, split = blockIdx.z;
  const int num_heads = gridDim.x, num_splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = lane / kLanesPerRow, part = lane % kLanesPerRow;
  const int kv_head = h / group;
  start_dependent_part();  // pdl.cuh: q, positions and the cache come from earlier kernels

  // Rows 0 .. positions[t], clamped to the cache (compared first: + 1 overflows at INT64_MAX).
  const int64_t last = static_cast<int64_t>(positions[t]);
  const int64_t length = last < cache_rows ? last + 1 : cache_rows;
  const int64_t begin = split * split_size;
  const int64_t end = min(begin + split_size, length);

  float qv[kVec];
  {
    const V v = load_vec<T, kVec>(q + t * q_token_stride + h * q_head_stride + part * kVec);
#pragma unroll
    for (int e = 0; e < kVec; ++e) qv[e] = to_float(v.elt[e]) * scale_log2;  // logits in base 2
  }
  SoftmaxState<kVec> st;
  st.m = -positive_infinity();
  st.l = 0.0f;
#pragma unroll
  for (int e = 0; e < kVec; ++e) st.acc[e] = 0.0f;

  const T* k_base = k_cache + kv_head * kc_head_stride + part * kVec;
  const T* v_base = v_cache + kv_head * vc_head_stride + part * kVec;
  // Every lane runs the same trip count (the butterfly needs the whole warp). Rows come
  // in chunks of kAttnChunk batches whose k and v loads are all issued before the first
  // is used: one memory round trip per chunk, not per batch (the online update that
  // follows depends on the previous batch, so loads inside it would wait in turn).
  constexpr int kAttnChunk = 4;
  const int64_t step = kAttnWarps * kRowsPerWarp;
  for (int64_t chunk = begin + warp * kRowsPerWarp; chunk < end; chunk += kAttnChunk * step) {
    V kv[kAttnChunk], vv[kAttnChunk];
#pragma unroll
    for (int c = 0; c < kAttnChunk; ++c) {
      const int64_t p = chunk + c * step + slot;
      if (p < end) {
        kv[c] = load_vec<T, kVec>(k_base + p * kc_row_stride);
        vv[c] = load_vec<T, kVec>(v_base + p * vc_row_stride);
      }
    }
    // The chunk's scores first (independent of each other), then one online update for
    // the whole chunk: a chain of one max and one rescale per chunk, not per batch.
    float s[kAttnChunk];
    float chunk_max = -positive_infinity();
#pragma unroll
    for (int c = 0; c < kAttnChunk; ++c) {
      const int64_t p = chunk + c * step + slot;
      s[c] = 0.0f;
      if (p < end) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) s[c] = fmaf(qv[e], to_float(kv[c].elt[e]), s[c]);
      }
      s[c] = warp_reduce<SumOp, kLanesPerRow>(s[c]);
      if (p < end) chunk_max = fmaxf(chunk_max, s[c]);
    }
    if (chunk_max != -positive_infinity()) {  // this lane group has a row in the chunk
      const float m = fmaxf(st.m, chunk_max);
      const float cm = exp2f(st.m - m);
      st.l *= cm;
#pragma unroll
      for (int e = 0; e < kVec; ++e) st.acc[e] *= cm;
#pragma unroll
      for (int c = 0; c < kAttnChunk; ++c) {
        if (chunk + c * step + slot < end) {
          const float w = exp2f(s[c] - m);
          st.l += w;
#pragma unroll
          for (int e = 0; e < kVec; ++e) st.acc[e] = fmaf(w, to_float(vv[c].elt[e]), st.acc[e]);
        }
      }
      st.m = m;
    }
  }
  // Lane groups of a warp: butterfly over the slot bits.
#pragma unroll
  for (int offset = kLanesPerRow; offset < 32; offset <<= 1) {
    SoftmaxState<kVec> other;
    other.m = __shfl_xor_sync(0xffffffffu, st.m, offset);
    other.l = __shfl_xor_sync(0xffffffffu, st.l, offset);
#pragma unroll
    for (int e = 0; e < kVec; ++e) other.acc[e] = __shfl_xor_sync(0xffffffffu, st.acc[e], offset);
    // Lower slot first, so both partners compute the same bits.
    if (slot & (offset / kLanesPerRow)) {
      merge_state(other, st);
      st = other;
    } else {
      merge_state(st, other);
    }
  }
  // Warps: through shared memory, in warp order.
  __shared__ float s_m[kAttnWarps], s_l[kAttnWarps];
  __shared__ float s_acc[kAttnWarps][kHeadDim];
  if (slot == 0) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) s_acc[warp][part * kVec + e] = st.acc[e];
    if (part == 0) {
      s_m[warp] = st.m;
      s_l[warp] = st.l;
    }
  }
  __syncthreads();
  if (warp == 0 && slot == 0) {
    // All warps at once, not one merge after another: the common max, then each warp's
    // weight exp2(m_w - max) (independent), then the weighted sums in warp order.
    float m = -positive_infinity();
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) m = fmaxf(m, s_m[w]);
    SoftmaxState<kVec> total;
    total.m = m;
    total.l = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) total.acc[e] = 0.0f;
    if (m != -positive_infinity()) {
#pragma unroll
      for (int w = 0; w < kAttnWarps; ++w) {
        const float scale = exp2f(s_m[w] - m);  // 0 for an empty warp (m_w = -inf)
        total.l = fmaf(scale, s_l[w], total.l);
#pragma unroll
        for (int e = 0; e < kVec; ++e) total.acc[e] = fmaf(scale, s_acc[w][part * kVec + e], total.acc[e]);
      }
    }
    const float inv_l = total.l > 0.0f ? 1.0f / total.l : 0.0f;  // empty: output 0
    if constexpr (kSplit) {
      const int64_t row = (static_cast<int64_t>(t) * num_heads + h) * num_splits + split;
#pragma unroll
      for (int e = 0; e < kVec; ++e) partial_out[row * kHeadDim + part * kVec + e] = total.acc[e] * inv_l;
      if (part == 0) partial_lse[row] = total.l > 0.0f ? total.m + log2f(total.l) : -positive_infinity();
    } else {
      float y[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) y[e] = total.acc[e] * inv_l;
      store_rounded<T, kVec>(out + t * out_token_stride + h * out_head_stride + part * kVec, y);
    }
  }
}

// Grid (num_heads, num_tokens), block kHeadDim threads: merges the num_splits partials of
// (t, h) in split order, weights exp2(lse_s - max lse), and rounds once to T.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kHeadDim) attention_combine_kernel(
    T* out, const float* partial_out, const float* partial_lse, int num_splits, int64_t out_token_stride,
    int64_t out_head_stride) {
  start_dependent_part();  // pdl.cuh
  const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
  const int64_t row0 = (static_cast<int64_t>(t) * gridDim.x + h) * num_splits;
  float m = -positive_infinity();
  for (int s = 0; s < num_splits; ++s) m = fmaxf(m, partial_lse[row0 + s]);
  float num = 0.0f, den = 0.0f;
  if (m != -positive_infinity()) {
    for (int s = 0; s < num_splits; ++s) {
      const float w = exp2f(partial_lse[row0 + s] - m);
      num += w * partial_out[(row0 + s) * kHeadDim + d];
      den += w;
    }
  }
  out[t * out_token_stride + h * out_head_stride + d] = from_float<T>(den > 0.0f ? num / den : 0.0f);
}

// ---------------------------------------------------------------- prefill attention
// 16 bytes of T (as bits) widened to float and stored to shared memory (16-byte aligned).
template <typename T> __device__ __forceinline__ void store_widened(float* dst, uint4 bits);
template <> __device__ __forceinline__ void store_widened<float>(float* dst, uint4 bits) {
  *reinterpret_cast<float4*>(dst) = make_float4(__uint_as_float(bits.x), __uint_as_float(bits.y),
                                                __uint_as_float(bits.z), __uint_as_float(bits.w));
}
template <> __device__ __forceinline__ void store_widened<__nv_bfloat16>(float* dst, uint4 bits) {
  // A bfloat16 is the high half of the float it widens to.
  const unsigned w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    *reinterpret_cast<float4*>(dst + 4 * j) = make_float4(
        __uint_as_float(w[2 * j] << 16), __uint_as_float(w[2 * j] & 0xffff0000u),
        __uint_as_float(w[2 * j + 1] << 16), __uint_as_float(w[2 * j + 1] & 0xffff0000u));
  }
}
template <> __device__ __forceinline__ void store_widened<__half>(float* dst, uint4 bits) {
  const unsigned w[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w[2 * j]));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&w[2 * j + 1]));
    *reinterpret_cast<float4*>(dst + 4 * j) = make_float4(a.x, a.y, b.x, b.y);
  }
}

// Many query tokens over one cache (flash-attention: Dao et al. 2022, arXiv:2205.14135),
// out[t, h] = sum_{p <= positions[t]} softmax_p(scale * q[t, h] . k_cache[p, g]) v_cache[p, g],
// g = h / group, the same math as decode_attention_kernel's (positions past cache_rows
// clamped to the cache, a negative position attends to nothing: output 0).
//
// Grid (num_tiles * num_kv_heads), block kWarps * 32 (plans.py::plan_prefill_attention).
// The query rows of kv head g are the (token, head-in-group) pairs r = t * group + j
// (query head g * group + j); a block takes kRowsPerTile = 32 / kLanesPerRow consecutive
// rows of one kv head (tiles in reverse order: the last tokens, with the longest key
// ranges, start first). Every warp holds all of them, kLanesPerRow lanes a row, each lane
// head_dim / kLanesPerRow dims of q and of the output accumulator in registers, in
// float4 chunks c = i * kLanesPerRow + part (so the lanes of a row read adjacent 16 bytes
// of shared memory). The warps split the keys 0 .. the tile's longest row: key tile j
// (kKeys keys) goes to warp j % kWarps, which stages it in its own shared memory as
// float (16-byte loads, the next tile's issued before the current one is used) and
// makes one online-softmax update a tile for each row, skipping the keys past that
// row's position. The warps' states then merge in warp order through shared memory.
// A key tile holding no key of a row leaves that row's state untouched, and an empty
// state merges as exact zeros, so a row's bits depend only on its position, its q row
// and the cache, not on the other rows of the call or of its tile (batch invariance).
// kHeadDim 64 or 128; kLanesPerRow (a power of two) and kWarps as plans.py sets them
// (PREFILL_ATTENTION_LANES_PER_ROW, PREFILL_ATTENTION_WARPS; the static_asserts say what
// else fits: 32 KiB of K/V tiles, reused by the merge). T float, __half or
// __nv_bfloat16; IdxT int or long long. Not a dependent launch (no pdl.cuh wait).
// Mutates out only.
template <typename T, typename IdxT, int kHeadDim, int kLanesPerRow, int kWarps>
__global__ void __launch_bounds__(kWarps * 32) prefill_attention_kernel(
    T* out,                 // [num_tokens, num_heads, head_dim]
    const T* q,             // [num_tokens, num_heads, head_dim]
    const T* k_cache,       // [cache_rows, num_kv_heads, head_dim]
    const T* v_cache,       // [cache_rows, num_kv_heads, head_dim]
    const IdxT* positions,  // [num_tokens]
    int group, int num_kv_heads, int64_t num_rows, int64_t q_token_stride, int64_t q_head_stride,
    int64_t kc_row_stride, int64_t kc_head_stride, int64_t vc_row_stride, int64_t vc_head_stride,
    int64_t out_token_stride, int64_t out_head_stride, int64_t cache_rows, float scale_log2) {
  constexpr int kVec = 16 / sizeof(T);              // elements of one 16-byte cache load
  constexpr int kDims = kHeadDim / kLanesPerRow;    // dims of a row one lane holds
  constexpr int kChunks = kDims / 4;                // ... as float4 chunks
  constexpr int kRowsPerTile = 32 / kLanesPerRow;
  constexpr int kSmemFloats = 8192;                 // 32 KiB
  // Keys of a warp's K/V tile: 32 KiB for 16-bit T, 16 KiB for float (whose 16-byte
  // vectors hold half as many elements: the same registers hold the next tile).
  constexpr int kKeys = kSmemFloats / (kHeadDim * kWarps * static_cast<int>(sizeof(T)));
  constexpr int kVecsPerKey = kHeadDim / kVec;
  constexpr int kLoads = kKeys * kVecsPerKey / 32;  // 16-byte loads of K (and of V) a lane makes a tile
  static_assert(32 % kLanesPerRow == 0 && kDims % 4 == 0, "lanes per row must split head_dim into float4s");
  static_assert(kKeys >= 1 && kLoads >= 1 && kKeys * kVecsPerKey == 32 * kLoads, "K/V tile must split over a warp");
  static_assert(kWarps * kRowsPerTile * kHeadDim <= kSmemFloats, "the merge must fit the K/V tiles' memory");
  const float kNegInf = -positive_infinity();

  __shared__ __align__(16) float s_mem[kSmemFloats];  // the warps' K/V tiles, then their states' acc
  __shared__ float s_m[kWarps][kRowsPerTile], s_l[kWarps][kRowsPerTile];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = lane / kLanesPerRow, part = lane % kLanesPerRow;
  const int kv_head = blockIdx.x % num_kv_heads;
  const int64_t num_tiles = gridDim.x / num_kv_heads;
  const int64_t tile = num_tiles - 1 - blockIdx.x / num_kv_heads;
  const int64_t row = tile * kRowsPerTile + slot;
  const bool has_row = row < num_rows;
  const int64_t t = has_row ? row / group : 0;
  const int h = kv_head * group + (has_row ? static_cast<int>(row - t * group) : 0);

  // This row's keys 0 .. positions[t], clamped to the cache (compared first: + 1
  // overflows at INT64_MAX); none for a negative position or a row past the last.
  int64_t length = 0;
  if (has_row) {
    const int64_t last = static_cast<int64_t>(positions[t]);
    length = last < 0 ? 0 : (last < cache_rows ? last + 1 : cache_rows);
  }
  // The tile's keys: 0 .. its longest row (every warp finds the same).
  int64_t end = length;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const int64_t other = __shfl_xor_sync(0xffffffffu, end, offset);
    end = other > end ? other : end;
  }

  float qv[kDims];
  {
    const T* q_row = q + t * q_token_stride + h * q_head_stride;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      Vec<T, 4> v;
      if (has_row) {
        v = load_vec<T, 4>(q_row + (i * kLanesPerRow + part) * 4);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) v.elt[e] = from_float<T>(0.0f);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) qv[i * 4 + e] = to_float(v.elt[e]) * scale_log2;  // logits in base 2
    }
  }
  float m = kNegInf, l = 0.0f, acc[kDims];
#pragma unroll
  for (int e = 0; e < kDims; ++e) acc[e] = 0.0f;

  float* s_k = s_mem + warp * 2 * kKeys * kHeadDim;  // this warp's tiles: [kKeys][kHeadDim] each
  float* s_v = s_k + kKeys * kHeadDim;
  const T* k_head = k_cache + kv_head * kc_head_stride;
  const T* v_head = v_cache + kv_head * vc_head_stride;
  uint4 raw_k[kLoads], raw_v[kLoads];  // 16-byte vectors as bits (16-bit elements stay packed)
  // Lane's share of the tile at key0 (zeros past the tile's keys).
  auto fetch = [&](int64_t key0) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = lane + 32 * i;
      const int64_t p = key0 + idx / kVecsPerKey;
      const int col = (idx % kVecsPerKey) * kVec;
      raw_k[i] = raw_v[i] = make_uint4(0u, 0u, 0u, 0u);
      if (p < end) {
        raw_k[i] = *reinterpret_cast<const uint4*>(k_head + p * kc_row_stride + col);
        raw_v[i] = *reinterpret_cast<const uint4*>(v_head + p * vc_row_stride + col);
      }
    }
  };

  int64_t key0 = static_cast<int64_t>(warp) * kKeys;
  if (key0 < end) fetch(key0);
  for (; key0 < end; key0 += kWarps * kKeys) {
    __syncwarp();  // every lane is done with the previous tile
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = lane + 32 * i;
      float* k_dst = s_k + (idx / kVecsPerKey) * kHeadDim + (idx % kVecsPerKey) * kVec;
      float* v_dst = s_v + (idx / kVecsPerKey) * kHeadDim + (idx % kVecsPerKey) * kVec;
      store_widened<T>(k_dst, raw_k[i]);
      store_widened<T>(v_dst, raw_v[i]);
    }
    __syncwarp();  // the tile is in shared memory
    if (key0 + kWarps * kKeys < end) fetch(key0 + kWarps * kKeys);  // in flight while this tile is used

    // The tile's scores (each a dot product over the row's lanes, summed by a
    // butterfly), then one online update for the row's keys of the tile.
    float s[kKeys];
    float tile_max = kNegInf;
#pragma unroll
    for (int c = 0; c < kKeys; ++c) {
      const float4* k_row = reinterpret_cast<const float4*>(s_k + c * kHeadDim);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const float4 kk = k_row[i * kLanesPerRow + part];
        dot = fmaf(qv[i * 4], kk.x, dot);
        dot = fmaf(qv[i * 4 + 1], kk.y, dot);
        dot = fmaf(qv[i * 4 + 2], kk.z, dot);
        dot = fmaf(qv[i * 4 + 3], kk.w, dot);
      }
      s[c] = warp_reduce<SumOp, kLanesPerRow>(dot);
      if (key0 + c < length) tile_max = fmaxf(tile_max, s[c]);
    }
    if (tile_max != kNegInf) {  // the tile holds keys of this row
      if (tile_max > m) {  // (else the rescale would multiply by exp2(0) = 1)
        const float cm = exp2f(m - tile_max);
        l *= cm;
#pragma unroll
        for (int e = 0; e < kDims; ++e) acc[e] *= cm;
        m = tile_max;
      }
#pragma unroll
      for (int c = 0; c < kKeys; ++c) {
        if (key0 + c < length) {
          const float w = exp2f(s[c] - m);
          l += w;
          const float4* v_row = reinterpret_cast<const float4*>(s_v + c * kHeadDim);
#pragma unroll
          for (int i = 0; i < kChunks; ++i) {
            const float4 vv = v_row[i * kLanesPerRow + part];
            acc[i * 4] = fmaf(w, vv.x, acc[i * 4]);
            acc[i * 4 + 1] = fmaf(w, vv.y, acc[i * 4 + 1]);
            acc[i * 4 + 2] = fmaf(w, vv.z, acc[i * 4 + 2]);
            acc[i * 4 + 3] = fmaf(w, vv.w, acc[i * 4 + 3]);
          }
        }
      }
    }
  }

  // Warps: each state to shared memory (the tiles' memory, free once every warp is
  // done), then warp 0 merges them in warp order, as decode_attention_kernel does.
  __syncthreads();
  {
    float4* mine = reinterpret_cast<float4*>(s_mem + (warp * kRowsPerTile + slot) * kHeadDim);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      mine[i * kLanesPerRow + part] = make_float4(acc[i * 4], acc[i * 4 + 1], acc[i * 4 + 2], acc[i * 4 + 3]);
    }
    if (part == 0) {
      s_m[warp][slot] = m;
      s_l[warp][slot] = l;
    }
  }
  __syncthreads();
  if (warp != 0 || !has_row) return;
  float total_m = kNegInf;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total_m = fmaxf(total_m, s_m[w][slot]);
  float total_l = 0.0f, total[kDims];
#pragma unroll
  for (int e = 0; e < kDims; ++e) total[e] = 0.0f;
  if (total_m != kNegInf) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float scale = exp2f(s_m[w][slot] - total_m);  // 0 for an empty state (m = -inf)
      total_l = fmaf(scale, s_l[w][slot], total_l);
      const float4* theirs = reinterpret_cast<const float4*>(s_mem + (w * kRowsPerTile + slot) * kHeadDim);
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const float4 a = theirs[i * kLanesPerRow + part];
        total[i * 4] = fmaf(scale, a.x, total[i * 4]);
        total[i * 4 + 1] = fmaf(scale, a.y, total[i * 4 + 1]);
        total[i * 4 + 2] = fmaf(scale, a.z, total[i * 4 + 2]);
        total[i * 4 + 3] = fmaf(scale, a.w, total[i * 4 + 3]);
      }
    }
  }
  const float inv_l = total_l > 0.0f ? 1.0f / total_l : 0.0f;  // empty: output 0
  T* out_row = out + t * out_token_stride + h * out_head_stride;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const float y[4] = {total[i * 4] * inv_l, total[i * 4 + 1] * inv_l, total[i * 4 + 2] * inv_l,
                        total[i * 4 + 3] * inv_l};
    store_rounded<T, 4>(out_row + (i * kLanesPerRow + part) * 4, y);
  }
}
