// cupykern/reduce.cuh: warp and row-group reductions in fp32.
//
// A "row group" is the kThreadsPerRow consecutive threads of a block that own one
// row. Groups of up to one warp reduce with __shfl_xor_sync inside the warp;
// larger groups reduce each warp, then combine the per-warp partials through
// shared memory. The order of every combination is fixed by kThreadsPerRow and
// kWarpSize alone, so a row's result does not depend on how many rows the block
// or the grid holds (batch invariance).
//
// Every thread of the block must call these functions the same number of times:
// threads whose row index is past the end still take part, with the identity.
#pragma once

namespace cupykern {

// NVRTC has no <math.h>; +inf spelled by its bits.
__device__ __forceinline__ float positive_infinity() { return __int_as_float(0x7f800000); }

struct SumOp {
  __device__ __forceinline__ static float identity() { return 0.0f; }
  __device__ __forceinline__ static float apply(float a, float b) { return a + b; }
};
// max/min propagate NaN as NumPy does (fmaxf/fminf would drop it, so a row with a
// NaN would report a finite extreme).
struct MaxOp {
  __device__ __forceinline__ static float identity() { return -positive_infinity(); }
  __device__ __forceinline__ static float apply(float a, float b) { return (a > b || a != a) ? a : b; }
};
struct MinOp {
  __device__ __forceinline__ static float identity() { return positive_infinity(); }
  __device__ __forceinline__ static float apply(float a, float b) { return (a < b || a != a) ? a : b; }
};

// Butterfly reduction over aligned groups of kGroupWidth lanes (a power of two,
// 1..kWarpSize); every lane of a group ends with the group's result.
template <typename Op, int kGroupWidth, int kWarpSize = 32>
__device__ __forceinline__ float warp_reduce(float v) {
  static_assert((kGroupWidth & (kGroupWidth - 1)) == 0 && kGroupWidth <= kWarpSize,
                "group width must be a power of two no wider than a warp");
#pragma unroll
  for (int offset = kGroupWidth / 2; offset > 0; offset >>= 1) {
    v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, offset, kWarpSize));
  }
  return v;
}

template <int kWarpSize> constexpr int max_warps_per_block() { return 1024 / kWarpSize; }

// Reduces v over the row group of kThreadsPerRow threads; every thread of the group
// gets the result. `scratch` holds one float per warp of the block; it is free again
// when the function returns (the trailing barrier guards its reuse).
template <typename Op, int kThreadsPerRow, int kWarpSize = 32>
__device__ __forceinline__ float row_group_reduce(float v, float* scratch) {
  if constexpr (kThreadsPerRow <= kWarpSize) {
    return warp_reduce<Op, kThreadsPerRow, kWarpSize>(v);
  } else {
    constexpr int kWarpsPerRow = kThreadsPerRow / kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    v = warp_reduce<Op, kWarpSize, kWarpSize>(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    // Every thread combines its group's partials in the same fixed order, so all
    // threads of the row see bit-identical results.
    const int first = (warp / kWarpsPerRow) * kWarpsPerRow;
    float r = scratch[first];
#pragma unroll
    for (int w = 1; w < kWarpsPerRow; ++w) r = Op::apply(r, scratch[first + w]);
    __syncthreads();
    return r;
  }
}

}  // namespace cupykern
