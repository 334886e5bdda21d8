// cupykern/gated_rows.cuh: the walk of the gated activations, shared by activation.cu
// and quant.cu.
//
//   y[r, i] = act(gate[r, i]) * up[r, i]     (fp32; act from cupykern/activations.cuh)
//
// Work items are (row, chunk) pairs: a row is ceil(d / kVecWidth) slots (the last may be
// the scalar tail), a chunk is blockDim.x consecutive slots, one per thread; a 1-D grid
// walks them grid-stride, or a 2-D grid gives each block one (launch contract in
// activation.cu). The values go to a store, which decides what is written:
// StoreRoundedRows (y rounded once to T: silu_and_mul, gelu_and_mul, swiglu) or the FP8
// store of quant.cu. Store contract:
// store.vec(row, i, y) for a full vector (float y[kVecWidth], elements i ..
// i + kVecWidth - 1 of row `row`), store.scalar(row, i, y) for one element of the tail;
// `row` is an int (a block per item) or an int64_t (the walk).
//
// d and the row strides are 32-bit (|value| < 2^31, checked in Python), the row offsets
// 64-bit (int64_t(row) * stride). 64-bit sizes and strides cost 0.04-0.07 us a call at
// 1-16 tokens and up to 0.17 at 64; at 1-16 tokens about half of that is the larger
// parameter list, half the 64-bit exit test and multiplies (bench/results/NOTES.md,
// item 19).
#pragma once
#include <cupykern/vec.cuh>
#include <cupykern/activations.cuh>

namespace cupykern {

// __launch_bounds__ of the gated kernels; cupykern/plans.py::ACTIVATION_MAX_BLOCK_SIZE mirrors it.
constexpr int kActMaxBlockSize = 1024;

// The store of the gated activations: y rounded once to T.
template <typename T>
struct StoreRoundedRows {
  T* out;                            // [num_rows, d], row_stride apart
  int row_stride;
  template <int kVecWidth, typename Row>
  __device__ __forceinline__ void vec(Row row, int i, const float (&y)[kVecWidth]) const {
    store_rounded<T, kVecWidth>(out + static_cast<int64_t>(row) * row_stride + i, y);
  }
  template <typename Row>
  __device__ __forceinline__ void scalar(Row row, int i, float y) const {
    out[static_cast<int64_t>(row) * row_stride + i] = from_float<T>(y);
  }
};

// Slot `slot` of row `row`: one full vector, or the scalar tail (kTail and kVecWidth > 1
// only, so a vector never reaches into the next row or past the buffer); nothing past the
// row's end. !kTail: d is a multiple of kVecWidth (the block-per-item grid's contract),
// so no test for the tail. Measured against the test (bench/results/NOTES.md, item 20,
// before the 4-byte vectors of item 22):
// with the 8-byte vectors of decode sizes -0.16 to +0.02 us a call (gelu_and_mul the
// most); with 16-byte ones (70b at 64 tokens, where 8-byte ones no longer fit one
// wave), silu_and_mul +0.06 to +0.08 and gelu_and_mul 0.00. Kept
// for one kernel of one contract: the 8-byte points are the ones below torch.compile.
template <typename T, int kAct, int kVecWidth, bool kTail, typename Store, typename Row>
__device__ __forceinline__ void act_and_mul_slot(const Store& store, const T* gate, const T* up, Row row,
                                                 unsigned slot, unsigned slots_per_row, int d,
                                                 int gate_row_stride, int up_row_stride) {
  // 16-bit inputs use the fast intrinsics (cupykern/activations.cuh says why and how
  // accurate); fp32 inputs the accurate libdevice functions.
  constexpr bool kFastMath = sizeof(T) == 2;
  if (slot >= slots_per_row) return;
  const int i = static_cast<int>(slot * kVecWidth);
  const T* gate_row = gate + static_cast<int64_t>(row) * gate_row_stride;
  const T* up_row = up + static_cast<int64_t>(row) * up_row_stride;
  if (!kTail || i + kVecWidth <= d) {
    // Full vector: one load of each input (4, 8 or 16 bytes), one store.
    const Vec<T, kVecWidth> g = load_vec<T, kVecWidth>(gate_row + i);
    const Vec<T, kVecWidth> u = load_vec<T, kVecWidth>(up_row + i);
    float y[kVecWidth];
#pragma unroll
    for (int e = 0; e < kVecWidth; ++e) y[e] = activate<kAct, kFastMath>(element(g, e)) * element(u, e);
    store.template vec<kVecWidth>(row, i, y);
  } else if constexpr (kTail && kVecWidth > 1) {
    for (int j = i; j < d; ++j) {
      store.scalar(row, j, activate<kAct, kFastMath>(to_float(gate_row[j])) * to_float(up_row[j]));
    }
  }
}

// The rows' work items, each once. kGridStride: a 1-D grid of any size walks the (row,
// chunk) items grid-stride (one resident wave; rows past the grid's y limit, with a
// scalar tail, or scalar past one wave). Else the grid is (chunks_per_row, num_rows) and
// a block does one item:
// no divisions and no loop before the first load, which at decode sizes is most of the
// kernel's time (the walk's three 32-bit divisions put 96 instructions before it;
// bench/results/NOTES.md, item 18), and at prefill sizes 3.5-6 % faster than the walk
// (item 26).
template <typename T, int kAct, int kVecWidth, bool kGridStride, typename Store>
__device__ __forceinline__ void act_and_mul_rows(
    const Store& store,              // where y goes (see the contract above)
    const T* gate,                   // [num_rows, d], gate_row_stride apart
    const T* up,                     // [num_rows, d], up_row_stride apart
    int64_t num_rows, int d, int gate_row_stride, int up_row_stride) {
  // In-row indices are 32-bit (d < 2^31 - 16: plans.plan_activation checks it). 64-bit
  // in-row indices (before the sizes and strides of the header's note) cost silu_and_mul
  // 0.04 us at one token and 0.3 us at 64 (of 1.46 and 2.56), and gelu_and_mul bf16 10 of
  // its 42 registers (bench/results/NOTES.md, item 17).
  const unsigned slots_per_row = (static_cast<unsigned>(d) + kVecWidth - 1) / kVecWidth;
  if constexpr (!kGridStride) {
    act_and_mul_slot<T, kAct, kVecWidth, false>(store, gate, up, static_cast<int>(blockIdx.y),
                                         blockIdx.x * blockDim.x + threadIdx.x, slots_per_row, d, gate_row_stride,
                                         up_row_stride);
    return;
  }
  const unsigned chunks_per_row = (slots_per_row + blockDim.x - 1) / blockDim.x;
  const int64_t num_chunks = num_rows * chunks_per_row;

  // Position of this block's first work item, then a division-free grid-stride walk:
  // the step of gridDim.x chunks is step_rows rows plus step_chunks chunks.
  int64_t row = blockIdx.x / chunks_per_row;
  unsigned chunk = blockIdx.x % chunks_per_row;
  const unsigned step_rows = gridDim.x / chunks_per_row;
  const unsigned step_chunks = gridDim.x % chunks_per_row;

  for (int64_t work = blockIdx.x; work < num_chunks; work += gridDim.x) {
    act_and_mul_slot<T, kAct, kVecWidth, true>(store, gate, up, row, chunk * blockDim.x + threadIdx.x, slots_per_row, d,
                                         gate_row_stride, up_row_stride);
    row += step_rows;
    chunk += step_chunks;
    if (chunk >= chunks_per_row) {
      chunk -= chunks_per_row;
      ++row;
    }
  }
}

}  // namespace cupykern
