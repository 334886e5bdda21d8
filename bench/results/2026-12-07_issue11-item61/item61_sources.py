"""NOTES item 61: apply_rope's token kernel with its cos/sin row requested among its q/k loads.

Since item 59 the kernel issues all of a thread's q/k loads, then waits on the position,
then requests the cos/sin row. Unfenced (before item 59) ptxas issued the row after 5 of
70b's 12 q/k loads (6 heads a thread), and on the H100 that form was 1.0-3.2 % faster at
528-1584 tokens (item 60). mid(m) requests the row after the first m heads' loads, at the
position clamped into the cache (so an out-of-range token reads a row it does not use),
then the other heads' loads: an out-of-range token's write-back, and every in-range
token's bits, as the tree's kernel.

mid(m)   rope.cu with apply_rope_token_kernel so changed (m heads first).

fence_mid_sass.py reads the loads' order in the SASS of each (no GPU): ptxas issues every
q/k load first whatever m, so the variant is the tree's kernel in another spelling.
"""
from cupykern import jit

LOADS = """  V va[kHeadsPerThread], vb[kHeadsPerThread];
#pragma unroll
  for (int j = 0; j < kHeadsPerThread; ++j) {
    const T* x = head_ptr(slot + j * head_slots);
    va[j] = load_vec<T, kVecWidth>(x + lo);
    vb[j] = load_vec<T, kVecWidth>(x + hi);
  }
"""
COS_SIN = """  float c[kVecWidth], s[kVecWidth];
  load_cos_sin<TCache, kVecWidth>(cos_sin_cache + pos * cache_stride, half, lane, c, s);
"""
MID = """  V va[kHeadsPerThread], vb[kHeadsPerThread];
  constexpr int kFirst = {m} < kHeadsPerThread ? {m} : kHeadsPerThread;
#pragma unroll
  for (int j = 0; j < kFirst; ++j) {{
    const T* x = head_ptr(slot + j * head_slots);
    va[j] = load_vec<T, kVecWidth>(x + lo);
    vb[j] = load_vec<T, kVecWidth>(x + hi);
  }}
  float c[kVecWidth], s[kVecWidth];
  {{
    const int64_t row = pos < 0 ? 0 : (pos >= max_position ? max_position - 1 : pos);
    load_cos_sin<TCache, kVecWidth>(cos_sin_cache + row * cache_stride, half, lane, c, s);
  }}
#pragma unroll
  for (int j = kFirst; j < kHeadsPerThread; ++j) {{
    const T* x = head_ptr(slot + j * head_slots);
    va[j] = load_vec<T, kVecWidth>(x + lo);
    vb[j] = load_vec<T, kVecWidth>(x + hi);
  }}
"""


def mid(m: int) -> str:
    text = jit.source("rope.cu")
    start = text.index("apply_rope_token_kernel(")
    end = text.index("\n}\n", start)
    body = text[start:end]
    assert body.count(LOADS) == 1 and body.count(COS_SIN) == 1, "apply_rope_token_kernel changed: update LOADS"
    body = body.replace(COS_SIN, "").replace(LOADS, MID.format(m=m))
    return text[:start] + body + text[end:]
