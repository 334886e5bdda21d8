// cupykern/gated_rows.cuh: the walk of the gated activations, shared by activation.cu
// and quant.cu.
//
//   y[r, i] = act(gate[r, i]) * up[r, i]     (fp32; act from cupykern/activations.cuh)
//
// A row is ceil(d / kVecWidth) slots (the last may be the scalar tail), one per thread
// at a time: blockIdx.x walks a row's chunks of blockDim.x consecutive slots and
// blockIdx.y the rows, each grid-stride (launch contract in activation.cu). The values go to a store, which
// decides what is written: StoreRoundedRows (y rounded once to T: silu_and_mul,
// gelu_and_mul, swiglu) or the FP8 store of quant.cu. Store contract:
// store.vec(row, i, y) for a full vector (float y[kVecWidth], elements i ..
// i + kVecWidth - 1 of row `row`), store.scalar(row, i, y) for one element of the tail.
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
  int64_t row_stride;
  template <int kVecWidth>
  __device__ __forceinline__ void vec(int64_t row, int64_t i, const float (&y)[kVecWidth]) const {
    store_rounded<T, kVecWidth>(out + row * row_stride + i, y);
  }
  __device__ __forceinline__ void scalar(int64_t row, int64_t i, float y) const {
    out[row * row_stride + i] = from_float<T>(y);
  }
};

template <typename T, int kAct, int kVecWidth, typename Store>
__device__ __forceinline__ void act_and_mul_rows(
    const Store& store,              // where y goes (see the contract above)
    const T* gate,                   // [num_rows, d], gate_row_stride apart
    const T* up,                     // [num_rows, d], up_row_stride apart
    int64_t num_rows, int64_t d, int64_t gate_row_stride, int64_t up_row_stride) {
  using V = Vec<T, kVecWidth>;
  // 16-bit inputs use the fast intrinsics (cupykern/activations.cuh says why and how
  // accurate); fp32 inputs the accurate libdevice functions.
  constexpr bool kFastMath = sizeof(T) == 2;
  const int64_t slots_per_row = (d + kVecWidth - 1) / kVecWidth;
  const int64_t slot_step = static_cast<int64_t>(gridDim.x) * blockDim.x;

  // blockIdx.y walks the rows and blockIdx.x a row's chunks, both grid-stride: no
  // integer division before the first load (a 1-D walk over (row, chunk) pairs divided
  // by chunks_per_row three times, ~0.2 us of a 1.45 us decode-size call;
  // bench/results/NOTES.md, item 16).
  for (int64_t row = blockIdx.y; row < num_rows; row += gridDim.y) {
    const T* gate_row = gate + row * gate_row_stride;
    const T* up_row = up + row * up_row_stride;
    for (int64_t slot = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; slot < slots_per_row;
         slot += slot_step) {
      const int64_t i = slot * kVecWidth;
      if (i + kVecWidth <= d) {
        // Full vector: one 16-byte load of each input, one store.
        const V g = load_vec<T, kVecWidth>(gate_row + i);
        const V u = load_vec<T, kVecWidth>(up_row + i);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = activate<kAct, kFastMath>(to_float(g.elt[e])) * to_float(u.elt[e]);
        store.template vec<kVecWidth>(row, i, y);
      } else {
        // Scalar tail: the last d % kVecWidth elements (kVecWidth > 1 only), so a
        // vector never reaches into the next row or past the buffer.
        for (int64_t j = i; j < d; ++j) {
          store.scalar(row, j, activate<kAct, kFastMath>(to_float(gate_row[j])) * to_float(up_row[j]));
        }
      }
    }
  }
}

}  // namespace cupykern
