// softmax.cu: softmax over the last axis.
//
// Math (fp32): y = exp((x - max(x)) / temperature) / sum(exp((x - max(x)) / temperature)),
// rounded once to TOut. Subtracting the row maximum keeps exp from overflowing. A row
// whose entries are all -inf gives NaN (-inf - -inf), as the float64 reference does; -inf
// entries in an otherwise finite row give exact zeros; NaN anywhere makes the row NaN.
// exp is libdevice expf for fp32 outputs and __expf for fp16/bf16 outputs, whose
// rounding hides its error (cupykern/fastmath.cuh): each element pays it twice (sum,
// then normalise), and at 16384 x 4096 bf16 the accurate expf held softmax to 66% of
// copy while rms_norm, the same traffic, ran at 94%.
// Source: the standard max-subtracted softmax (e.g. Goodfellow et al., Deep Learning,
// sec. 4.1; torch.softmax's semantics with a temperature divisor).
//
// Layout: num_rows rows of hidden_size elements, unit stride along a row, rows
// *_row_stride elements apart (64-bit offsets). Mutates `out` only (it may be x when
// TOut == T).
//
// Template parameters: T (input) and TOut (output): float, __half, __nv_bfloat16;
// kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize as in norm.cu. The launch
// contract is norm.cu's (cupykern/plans.py::plan_rows).
#include <cupykern/vec.cuh>
#include <cupykern/reduce.cuh>
#include <cupykern/rows.cuh>
#include <cupykern/fastmath.cuh>

using namespace cupykern;

template <typename T, typename TOut, int kThreadsPerRow, int kVecWidth, int kVecsPerThread,
          int kWarpSize>
__global__ void __launch_bounds__(max_block_size<kThreadsPerRow>()) softmax_kernel(
    TOut* out,                       // [num_rows, hidden_size]
    const T* x,                      // [num_rows, hidden_size]
    int64_t num_rows, int64_t hidden_size, int64_t x_row_stride, int64_t out_row_stride,
    float inv_temperature) {
  using V = Vec<T, kVecWidth>;
  constexpr bool kFastMath = sizeof(TOut) == 2;
  __shared__ float scratch[max_warps_per_block<kWarpSize>()];
  const RowGroup<kThreadsPerRow> g;
  const int64_t num_vecs = hidden_size / kVecWidth;
  const int64_t tail_start = num_vecs * kVecWidth;
  V cache[kVecsPerThread];

  for (int64_t base = g.first_base(); base < num_rows; base += g.base_step()) {
    const int64_t row = base + g.group;
    const bool active = row < num_rows;
    const int64_t my_vecs = active ? num_vecs : 0;
    const int64_t my_end = active ? hidden_size : 0;
    const T* x_row = x + row * x_row_stride;
    TOut* out_row = out + row * out_row_stride;
    auto vec_at = [&](int slot, int64_t v) -> V {
      return slot >= 0 ? cache[slot] : load_vec<T, kVecWidth>(x_row + v * kVecWidth);
    };

    // Pass 1: load into registers, row maximum (NaN-propagating).
    float row_max = MaxOp::identity();
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = load_vec<T, kVecWidth>(x_row + v * kVecWidth);
      if (slot >= 0) cache[slot] = a;
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) row_max = MaxOp::apply(row_max, to_float(a.elt[e]));
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane,
                                  [&](int64_t i) { row_max = MaxOp::apply(row_max, to_float(x_row[i])); });
    row_max = row_group_reduce<MaxOp, kThreadsPerRow, kWarpSize>(row_max, scratch);

    // Pass 2: sum of exponentials.
    float sum = 0.0f;
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = vec_at(slot, v);
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) sum += exp_of<kFastMath>((to_float(a.elt[e]) - row_max) * inv_temperature);
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane,
                                  [&](int64_t i) { sum += exp_of<kFastMath>((to_float(x_row[i]) - row_max) * inv_temperature); });
    const float inv_sum = 1.0f / row_group_reduce<SumOp, kThreadsPerRow, kWarpSize>(sum, scratch);

    // Pass 3: normalise, round once, store.
    for_each_vec<kThreadsPerRow, kVecsPerThread>(my_vecs, g.lane, [&](int slot, int64_t v) {
      const V a = vec_at(slot, v);
      float y[kVecWidth];
#pragma unroll
      for (int e = 0; e < kVecWidth; ++e) y[e] = exp_of<kFastMath>((to_float(a.elt[e]) - row_max) * inv_temperature) * inv_sum;
      store_rounded<TOut, kVecWidth>(out_row + v * kVecWidth, y);
    });
    for_each_tail<kThreadsPerRow>(tail_start, my_end, g.lane, [&](int64_t i) {
      out_row[i] = from_float<TOut>(exp_of<kFastMath>((to_float(x_row[i]) - row_max) * inv_temperature) * inv_sum);
    });
  }
}
