// bb81c7e's qk_rms_norm_rope_wide_kernel (kernels_cu/rope.cu), renamed: qk_prev.py appends it
// to this tree's rope.cu (kQkWideMinBlocksPerSm and the helpers come from there).
template <typename T, typename TCache, typename TPos, bool kIsNeox, int kVecWidth, int kThreadsPerHead,
          int kHeadsPerThread>
__global__ void __launch_bounds__(kRopeMaxBlockSize, kQkWideMinBlocksPerSm) qk_prev_wide_kernel(
    T* q, T* k, const T* __restrict__ q_weight, const T* __restrict__ k_weight,
    const TPos* __restrict__ positions, const TCache* __restrict__ cos_sin_cache,
    int64_t num_tokens, int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim,
    int64_t rotary_dim, int64_t max_position, int64_t positions_stride,
    int64_t q_token_stride, int64_t q_head_stride, int64_t k_token_stride, int64_t k_head_stride,
    int64_t cache_stride, float eps, int head_slots, int tokens_per_block) {
  using V = Vec<T, kVecWidth>;
  const RopeThread th(kThreadsPerHead, head_slots);
  const int64_t half = rotary_dim / 2;
  const int64_t units = half / kVecWidth;
  const int64_t pass_vecs = (head_dim - rotary_dim) / kVecWidth;
  const int64_t num_heads = num_q_heads + num_kv_heads;
  const float inv_head_dim = 1.0f / static_cast<float>(head_dim);
  const bool has_unit = th.lane < units;
  const bool has_pass = th.lane < pass_vecs;
  int64_t lo, hi;
  unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo, hi);
  const int64_t p_off = rotary_dim + static_cast<int64_t>(th.lane) * kVecWidth;
  V wqa, wqb, wka, wkb;
  if (has_unit) {
    wqa = load_vec<T, kVecWidth>(q_weight + lo);
    wqb = load_vec<T, kVecWidth>(q_weight + hi);
    wka = load_vec<T, kVecWidth>(k_weight + lo);
    wkb = load_vec<T, kVecWidth>(k_weight + hi);
  }

  for (int64_t base = static_cast<int64_t>(blockIdx.x) * tokens_per_block; base < num_tokens;
       base += static_cast<int64_t>(gridDim.x) * tokens_per_block) {
    const int64_t token = base + th.tok_sub;
    const bool in_range = th.tok_sub < tokens_per_block && token < num_tokens;
    // Requested here, waited on only after this token's q/k loads are in flight.
    const int64_t pos = in_range ? static_cast<int64_t>(positions[token * positions_stride]) : -1;
    auto head_ptr = [&](int64_t h) -> T* {
      return h < num_q_heads ? q + token * q_token_stride + h * q_head_stride
                             : k + token * k_token_stride + (h - num_q_heads) * k_head_stride;
    };
    V xa[kHeadsPerThread], xb[kHeadsPerThread], xp[kHeadsPerThread];
#pragma unroll
    for (int j = 0; j < kHeadsPerThread; ++j) {
      const int64_t h = th.slot + j * static_cast<int64_t>(head_slots);
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
      const bool active = token_ok && th.slot + j * static_cast<int64_t>(head_slots) < num_heads;
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
      const int64_t h = th.slot + j * static_cast<int64_t>(head_slots);
      if (h >= num_heads) break;
      const bool is_q = h < num_q_heads;
      T* x = head_ptr(h);
      if (has_unit) {
        const V& wa = is_q ? wqa : wka;
        const V& wb = is_q ? wqb : wkb;
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
        const V wp = load_vec<T, kVecWidth>((is_q ? q_weight : k_weight) + p_off);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = to_float(xp[j].elt[e]) * inv_rms[j] * to_float(wp.elt[e]);
        store_rounded<T, kVecWidth>(x + p_off, y);
      }
    }
  }
}
