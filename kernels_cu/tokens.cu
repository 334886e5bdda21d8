// tokens.cu: from logits to the next step's input, on the device.
//   sample_tokens_kernel   argmax of a logits row (greedy) or a Gumbel-max draw with
//                          Philox4x32-10 noise keyed by a seed and the token's position
//   embedding_kernel       out[t] = weight[token_ids[t]]
//   append_tokens_kernel   positions[b] += 1; history[b, positions[b]] = tokens[b]
//
// Part of the decode kernels (gemv.cu, attention.cu, tokens.cu): each can run inside a
// captured CUDA graph, since every size it needs from the sequence (position, length) is
// read from device memory, so a replay needs no new kernel arguments; and each may be
// launched as a programmatic dependent launch (pdl.cuh: it waits for the kernels before
// it before it reads or writes anything they touch).
//
// Sources: Gumbel-max sampling, Gumbel 1954, Maddison et al. 2014 (arXiv:1411.0292);
// Philox4x32-10, Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011
// (Random123's round constants and key schedule).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/pdl.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- sampling
// Philox4x32-10 (Salmon et al. 2011; Random123's round constants and key schedule).
struct Philox4 {
  unsigned int x, y, z, w;
};

__device__ __forceinline__ Philox4 philox4x32_10(Philox4 c, unsigned int k0, unsigned int k1) {
  constexpr unsigned int kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const unsigned int hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
    const unsigned int hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
    c = Philox4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

constexpr int kSampleThreads = 1024;

// One block per row t of logits ([num_tokens, vocab], row_stride apart, float32).
// temperature == 0: out[t] = the first index of the row's maximum. temperature > 0: out[t]
// = argmax_i (logits[t, i] + temperature * g_i), the Gumbel-max draw from softmax(logits /
// temperature) written without dividing by the temperature (so no overflow for tiny
// ones), g_i = -log(-log(u_i)), u_i = ((philox(i, counter[t], 0, 0; seed).x >> 8) + 0.5) /
// 2^24, counter[t] = positions[t] (0 without positions). A row holding n > 0 NaN or
// infinite logits gives out[t] = -n: a forward that went wrong shows instead of a token.
// Mutates out only.
template <typename IdxT, bool kHasPositions>
__global__ void __launch_bounds__(kSampleThreads) sample_tokens_kernel(
    int* out, const float* logits, const IdxT* positions, int64_t vocab, int64_t row_stride, float temperature,
    unsigned int seed_lo, unsigned int seed_hi) {
  start_dependent_part();  // pdl.cuh
  const int t = blockIdx.x;
  const float* row = logits + t * row_stride;
  const unsigned int counter = kHasPositions ? static_cast<unsigned int>(positions[t]) : 0u;
  float best = -positive_infinity();
  int64_t best_index = vocab;  // beyond every index: loses ties to any real one
  int nonfinite = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kSampleThreads) {
    const float logit = row[i];
    if (!isfinite(logit)) {
      ++nonfinite;
      continue;
    }
    float z = logit;
    if (temperature > 0.0f) {
      const Philox4 r = philox4x32_10(Philox4{static_cast<unsigned int>(i), counter, 0u, 0u}, seed_lo, seed_hi);
      const float u = (static_cast<float>(r.x >> 8) + 0.5f) * 5.9604644775390625e-8f;  // 2^-24
      z = fmaf(temperature, -logf(-logf(u)), logit);
    }
    if (z > best) {  // indices rise along a thread's walk: ties keep the first
      best = z;
      best_index = i;
    }
  }
  __shared__ float s_best[kSampleThreads / 32];
  __shared__ long long s_index[kSampleThreads / 32];
  __shared__ int s_bad[kSampleThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, offset);
    const long long oi = __shfl_xor_sync(0xffffffffu, static_cast<long long>(best_index), offset);
    if (ob > best || (ob == best && oi < best_index)) {
      best = ob;
      best_index = oi;
    }
    nonfinite += __shfl_xor_sync(0xffffffffu, nonfinite, offset);
  }
  if (lane == 0) {
    s_best[warp] = best;
    s_index[warp] = best_index;
    s_bad[warp] = nonfinite;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int bad = 0;
    for (int w = 0; w < kSampleThreads / 32; ++w) {
      bad += s_bad[w];
      if (s_best[w] > best || (s_best[w] == best && s_index[w] < best_index)) {
        best = s_best[w];
        best_index = s_index[w];
      }
    }
    out[t] = bad ? -bad : static_cast<int>(best_index);
  }
}

// ---------------------------------------------------------------- embedding
// One block per token: out[t] = weight[token_ids[t]] (a copy; kVecWidth as gemv_kernel).
// An id outside [0, num_embeddings) writes a row of NaN, which sample_tokens_kernel then
// reports (the Python side checks ids unless told not to). Mutates out only.
template <typename T, typename IdxT, int kVecWidth>
__global__ void __launch_bounds__(256) embedding_kernel(
    T* out, const IdxT* token_ids, const T* weight, int64_t num_embeddings, int64_t hidden_size,
    int64_t weight_row_stride, int64_t out_row_stride) {
  using V = Vec<T, kVecWidth>;
  start_dependent_part();  // pdl.cuh
  const int t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(token_ids[t]);
  T* dst = out + t * out_row_stride;
  if (id < 0 || id >= num_embeddings) {
    const T nan = from_float<T>(__int_as_float(0x7fc00000));
    for (int64_t i = threadIdx.x; i < hidden_size; i += blockDim.x) dst[i] = nan;
    return;
  }
  const T* src = weight + id * weight_row_stride;
  for (int64_t i = threadIdx.x * kVecWidth; i < hidden_size; i += blockDim.x * kVecWidth) {
    store_vec<T, kVecWidth>(dst + i, load_vec<T, kVecWidth>(src + i));
  }
}

// ---------------------------------------------------------------- decode bookkeeping
// One thread per sequence b: positions[b] += 1, then history[b, positions[b]] = tokens[b]
// (skipped past history_len, and for a negative position: INT_MAX + 1 wraps to INT_MIN, as
// an int32 does). The last kernel of a captured decode step: it moves the step's position
// on, so the next replay reads the next one. Mutates positions, history.
__global__ void append_tokens_kernel(int* positions, int* history, const int* tokens, int num_sequences,
                                     int64_t history_len) {
  start_dependent_part();  // pdl.cuh
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= num_sequences) return;
  const int p = static_cast<int>(static_cast<unsigned int>(positions[b]) + 1u);  // no signed overflow
  positions[b] = p;
  if (p >= 0 && p < history_len) history[b * history_len + p] = tokens[b];
}
