"""apply_rope_wide_kernel's source with one change at a time (rope_wide_lib.py, regs.py).
Each patch must match exactly once in the wide kernel's part of rope.cu."""
from cupykern import jit
BASE = jit.source("rope.cu")
WIDE = BASE.index("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks")
PATCHES = {
    # out pointers are the in pointers (in place), so no second set of addresses
    "inplace": ("      T* out = h < num_q_heads ? q_out_tok + h * q_out_head_stride : k_out_tok + (h - num_q_heads) * k_out_head_stride;",
                "      T* out = const_cast<T*>(h < num_q_heads ? q_tok + h * q_head_stride : k_tok + (h - num_q_heads) * k_head_stride);"),
    # head offsets in 32 bits (h < 2^31 heads, h * stride < 2^31 checked in Python)
    "h32a": ("      const int64_t h = th.slot + j * head_slots;\n      if (h < num_heads) {\n        const T* in = h < num_q_heads ? q_tok + h * q_head_stride : k_tok + (h - num_q_heads) * k_head_stride;",
             "      const int h = th.slot + j * head_slots;\n      if (h < num_heads) {\n        const T* in = h < num_q_heads ? q_tok + h * q_head_stride : k_tok + (h - num_q_heads) * k_head_stride;"),
    "h32b": ("      const int64_t h = th.slot + j * head_slots;\n      if (h >= num_heads) break;",
             "      const int h = th.slot + j * head_slots;\n      if (h >= num_heads) break;"),
    "novalid": ("""      if (!valid) {  // in place: not written; out of place: copied unchanged
        if (copy_unrotated) {
          store_vec<T, kVecWidth>(out + lo, va[j]);
          store_vec<T, kVecWidth>(out + hi, vb[j]);
        }
        continue;
      }
      rotate_and_store""", "      rotate_and_store"),
    "nopass": ("    if (copy_unrotated && pass_vecs > 0) {\n      for (int64_t h = th.slot;",
               "    if (false) {\n      for (int64_t h = th.slot;"),
    "lo32": ("  int64_t lo, hi;\n  unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo, hi);\n\n  for (int64_t token",
             "  int lo, hi;\n  { int64_t lo_, hi_; unit_offsets<kIsNeox, kVecWidth>(th.lane, half, lo_, hi_); lo = (int)lo_; hi = (int)hi_; }\n\n  for (int64_t token"),
    # threads_per_head known at compile time (8: bf16, rotary_dim 128, 8-wide vectors)
    "tph8": ("  const RopeThread th(threads_per_head, head_slots);\n  if (th.tok_sub >= tokens_per_block) return;  // padding up to a whole warp\n  const int64_t half = rotary_dim / 2;\n  const int64_t pass_vecs",
             "  const RopeThread th(8, head_slots);\n  if (th.tok_sub >= tokens_per_block) return;  // padding up to a whole warp\n  const int64_t half = rotary_dim / 2;\n  const int64_t pass_vecs"),
    "nominblocks": ("__launch_bounds__(kRopeMaxBlockSize, rope_wide_min_blocks<kHeadsPerThread, kMropeLayout>())",
                    "__launch_bounds__(kRopeMaxBlockSize)"),
}
def patched(names):
    head, tail = BASE[:WIDE], BASE[WIDE:]
    for n in names:
        old, new = PATCHES[n]
        assert tail.count(old) == 1, (n, tail.count(old))
        tail = tail.replace(old, new, 1)
    return head + tail
