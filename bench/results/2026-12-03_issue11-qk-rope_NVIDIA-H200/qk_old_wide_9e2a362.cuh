// qk_rms_norm_rope_wide_kernel as of 9e2a362 (renamed; kRopeWideMaxHeads = 4 spelled out), timed by qk_iso.py.
// qk_rms_norm_rope, wide: needs units <= kThreadsPerHead and pass-through vectors <=
// kThreadsPerHead (each lane holds at most one unit and one pass-through vector of a
// head; cupykern/plans.py::plan_rope checks it), so a lane's sum of squares is its
// unit's then its pass-through vector's, in the order of the kernel above. All threads
// run the same token and head iterations (heads_per_thread is uniform) for the shuffles.
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead>
__global__ void __launch_bounds__(kRopeMaxBlockSize) qk_old_wide_kernel(
    T* q, T* k, const T* __restrict__ q_weight, const T* __restrict__ k_weight,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
    int64_t rotary_dim, int64_t max_position, int64_t positions_stride,
    int64_t q_token_stride, int64_t q_head_stride, int64_t k_token_stride, int64_t k_head_stride,
    int64_t cache_stride, float eps, int head_slots, int tokens_per_block, int heads_per_thread) {
  using V = Vec<T, kVecWidth>;
  constexpr int kMaxHeads = 4;
  const RopeThread th(kThreadsPerHead, head_slots);
  const int64_t half = rotary_dim / 2;
  const int64_t units = half / kVecWidth;
  const int64_t pass_vecs = (head_dim - rotary_dim) / kVecWidth;
  const int64_t num_heads = num_q_heads + num_kv_heads;
  const int64_t head_iters = (num_heads + head_slots - 1) / head_slots;
  const float inv_head_dim = 1.0f / static_cast<float>(head_dim);
  const bool has_unit = th.lane < units;
  const bool has_pass = th.lane < pass_vecs;
  int64_t lo, hi;
  unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo, hi);
  const int64_t p_off = rotary_dim + static_cast<int64_t>(th.lane) * kVecWidth;

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens;
       base += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    const int64_t pos = in_range ? static_cast<int64_t>(positions[token * positions_stride]) : -1;

    for (int64_t it0 = 0; it0 < head_iters; it0 += heads_per_thread) {
      V xa[kMaxHeads], xb[kMaxHeads], xp[kMaxHeads];
#pragma unroll
      for (int j = 0; j < kMaxHeads; ++j) {
        const int64_t h = th.slot + (it0 + j) * head_slots;
        if (in_range && j < heads_per_thread && h < num_heads) {
          const T* x = h < num_q_heads ? q + token * q_token_stride + h * q_head_stride
                                       : k + token * k_token_stride + (h - num_q_heads) * k_head_stride;
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
      float inv_rms[kMaxHeads];
#pragma unroll
      for (int j = 0; j < kMaxHeads; ++j) {
        if (j >= heads_per_thread) break;  // uniform over the block
        const bool active = token_ok && th.slot + (it0 + j) * head_slots < num_heads;
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
#pragma unroll
      for (int j = 0; j < kMaxHeads; ++j) {
        const int64_t h = th.slot + (it0 + j) * head_slots;
        if (j >= heads_per_thread || !token_ok || h >= num_heads) break;
        const bool is_q = h < num_q_heads;
        T* x = is_q ? q + token * q_token_stride + h * q_head_stride
                    : k + token * k_token_stride + (h - num_q_heads) * k_head_stride;
        const T* w = is_q ? q_weight : k_weight;
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
}
