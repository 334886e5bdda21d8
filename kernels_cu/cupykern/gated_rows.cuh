// cupykern/gated_rows.cuh: the walk of the gated activations, shared by activation.cu
// and quant.cu.
//
//   y[r, i] = act(gate[r, i]) * up[r, i]     (fp32; act from cupykern/activations.cuh)
//
// Work items are (row, chunk) pairs walked grid-stride: a row is ceil(d / kVecWidth)
// slots (the last may be the scalar tail), a chunk is blockDim.x consecutive slots, one
// per thread (launch contract in activation.cu). The values go to a store, which
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
  // In-row indices are 32-bit (d < 2^31: plans.plan_activation checks it). The 64-bit
  // ones cost silu_and_mul 0.04 us at one token and 0.3 us at 64 (of 1.46 and 2.56), and
  // gelu_and_mul bf16 10 of its 42 registers (bench/results/NOTES.md, item 17).
  const unsigned slots_per_row = (static_cast<unsigned>(d) + kVecWidth - 1) / kVecWidth;
  const unsigned chunks_per_row = (slots_per_row + blockDim.x - 1) / blockDim.x;
  const int64_t num_chunks = num_rows * chunks_per_row;

  // Position of this block's first work item, then a division-free grid-stride walk:
  // the step of gridDim.x chunks is step_rows rows plus step_chunks chunks.
  int64_t row = blockIdx.x / chunks_per_row;
  unsigned chunk = blockIdx.x % chunks_per_row;
  const unsigned step_rows = gridDim.x / chunks_per_row;
  const unsigned step_chunks = gridDim.x % chunks_per_row;

  for (int64_t work = blockIdx.x; work < num_chunks; work += gridDim.x) {
    const unsigned slot = chunk * blockDim.x + threadIdx.x;
    if (slot < slots_per_row) {
      const int i = static_cast<int>(slot * kVecWidth);
      const T* gate_row = gate + row * gate_row_stride;
      const T* up_row = up + row * up_row_stride;
      if (i + kVecWidth <= d) {
        // Full vector: one 16-byte load of each input, one store.
        const V g = load_vec<T, kVecWidth>(gate_row + i);
        const V u = load_vec<T, kVecWidth>(up_row + i);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = activate<kAct, kFastMath>(to_float(g.elt[e])) * to_float(u.elt[e]);
        store.template vec<kVecWidth>(row, i, y);
      } else if constexpr (kVecWidth > 1) {
        // Scalar tail: the last d % kVecWidth elements (kVecWidth > 1 only), so a
        // vector never reaches into the next row or past the buffer.
        for (int j = i; j < d; ++j) {
          store.scalar(row, j, activate<kAct, kFastMath>(to_float(gate_row[j])) * to_float(up_row[j]));
        }
      }
    }
    row += step_rows;
    chunk += step_chunks;
    if (chunk >= chunks_per_row) {
      chunk -= chunks_per_row;
      ++row;
    }
  }
}

}  // namespace cupykern
