// softmax.cu: softmax over the last axis.
//
// Math (fp32): y = exp((x - max(x)) / temperature) / sum(exp((x - max(x)) / temperature)),
// rounded once to TOut. Subtracting the row maximum keeps exp from overflowing. A row
// whose entries are all -inf gives NaN (-inf - -inf), as the float64 reference does; -inf
// entries in an otherwise finite row give exact zeros; NaN anywhere makes the row NaN.
// exp is libdevice expf for fp32 outputs and __expf for fp16/bf16 outputs, whose
// rounding hides its error (cupykern/fastmath.cuh). An element of a leaf held in
// registers pays it once (the compiler shares pass 2's exp_at with pass 3's: 32
// MUFU.EX2 for the 32 elements of llama-3.1-70b's 256 x 4 decode layout, bench/sass.py);
// one read again pays it twice, and at 16384 x 4096 bf16 the accurate expf held softmax
// to 66% of copy while rms_norm, the same traffic, ran at 94%.
// Source: the standard max-subtracted softmax (e.g. Goodfellow et al., Deep Learning,
// sec. 4.1; torch.softmax's semantics with a temperature divisor).
//
// Layout: num_rows rows of hidden_size elements, unit stride along a row, rows
// *_row_stride elements apart (64-bit offsets). num_rows, hidden_size and the strides
// arrive as 32-bit ints (|value| < 2^31, checked in Python) and are widened by the 64-bit
// row index: 64-bit ones cost up to 0.10 us a call at decode sizes and up to 1.6 % at 4096
// tokens (bench/results/NOTES.md, item 20). Mutates `out` only (it may be x when
// TOut == T).
//
// The row maximum and the sum of exponentials are the row's fixed trees over 16-byte
// leaves of T (cupykern/reduce.cuh), so the bits do not depend on the layout.
//
// Template parameters: T (input) and TOut (output): float, __half, __nv_bfloat16;
// kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize, kExact as in norm.cu (kVecWidth
// and the leaves count elements of T). The launch contract is norm.cu's
// (cupykern/plans.py::plan_rows).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
#include <cupykern/fastmath.cuh>

using namespace cupykern;

template <typename T, typename TOut, int kThreadsPerRow, int kVecWidth, int kVecsPerThread,
          int kWarpSize, bool kExact>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) softmax_kernel(
    TOut* out,                       // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    int num_rows, int hidden_size, int x_row_stride, int out_row_stride,
    float inv_temperature) {
  constexpr int L = leaf_width<T>();
  using V = Vec<T, L>;
  constexpr bool kFastMath = sizeof(TOut) == 2;
  __shared__ float scratch[tree_scratch_floats<kThreadsPerRow, max_block_size<kThreadsPerRow>()>()];
  // One row a block (rows.cuh::RowGroup) in the exact walk only, which softmax takes at
  // decode sizes only (plans.py::EXACT_WALK), 256 x 4 included (llama-3.1-70b): -0.12..
  // -0.32 us a call at 1-64 tokens. Its prefill instantiations stay as they were: with
  // one row a block 256 x 4 measured 3 % faster at 4096 tokens of llama-3.1-70b in one
  // build and 30 % slower in another whose SASS differed by two instructions
  // (bench/results/NOTES.md, item 23). Otherwise one_row_per_block's layouts.
  const RowGroup<kThreadsPerRow, kExact && one_row_per_block<T, kThreadsPerRow, kVecsPerThread, kVecWidth>(8)> g;
  // fp32 out of a 16-bit row in the exact walk: each lane's leaf is 32 bytes of output,
  // stored by lane pairs in whole sectors (rows.cuh::store_fp32_leaf_paired).
  constexpr bool kPairedStores = kExact && sizeof(TOut) == 4 && sizeof(T) == 2 && kVecWidth == L &&
                                 kThreadsPerRow >= kWarpSize;
  V cache[kVecsPerThread];
  float column[kVecsPerThread];

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    // This lane's leaves of the row, f(slot, column, v, count) (cupykern/rows.cuh).
    auto walk_leaves = [&](auto&& f) {
      for_each_leaf<T, kThreadsPerRow, kVecsPerThread, kExact>(hidden_size, active, g.lane, f);
    };
    const T* x_row = x + row * x_row_stride;
    TOut* out_row = out + row * out_row_stride;
    auto leaf_at = [&](int slot, int64_t v, int count) -> V {
      return slot >= 0 ? cache[slot] : load_leaf<T, kVecWidth>(x_row, v, count);
    };

    // Pass 1: load into registers, row maximum (NaN-propagating).
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = MaxOp::identity();
    load_first_round<T, kThreadsPerRow, kExact>(hidden_size, active, g.lane, cache,
                                                [&](int64_t v) { return load_leaf<T, kVecWidth>(x_row, v, L); });
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      add_to_column<MaxOp>(column, col, fold_leaf<MaxOp, T>(a, count, [](float s, float e) {
        return MaxOp::apply(s, e);
      }));
    });
    const float row_max = row_tree_reduce<MaxOp, kThreadsPerRow, kVecsPerThread, kWarpSize>(column, scratch);
    auto exp_at = [&](float e) { return exp_of<kFastMath>(__fmul_rn(__fsub_rn(e, row_max), inv_temperature)); };

    // Pass 2: sum of exponentials.
#pragma unroll
    for (int a = 0; a < kVecsPerThread; ++a) column[a] = SumOp::identity();
    walk_leaves([&](int slot, int col, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      add_to_column<SumOp>(column, col, fold_leaf<SumOp, T>(a, count, [&](float s, float e) {
        return __fadd_rn(s, exp_at(e));
      }));
    });
    // The correctly rounded reciprocal: the bits of 1.0f / sum, without the division.
    const float inv_sum = __frcp_rn(row_tree_reduce<SumOp, kThreadsPerRow, kVecsPerThread, kWarpSize>(column, scratch));

    // Pass 3: normalise, round once, store.
    walk_leaves([&](int slot, int, int64_t v, int count) {
      const V a = leaf_at(slot, v, count);
      float y[L];
#pragma unroll
      for (int e = 0; e < L; ++e) y[e] = __fmul_rn(exp_at(element(a, e)), inv_sum);
      if constexpr (kPairedStores) {
        store_fp32_leaf_paired(out_row, v, y, g.lane);
      } else {
        emit_leaf<T, kVecWidth>(v, count, y, [&](int64_t i, const auto& yy) { store_rounded<TOut>(out_row + i, yy); },
                                [&](int64_t i, float yy) { out_row[i] = from_float<TOut>(yy); });
      }
    });
  }
}
