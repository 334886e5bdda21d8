// cupykern/rows.cuh: how a row-group of threads walks its row.
//
// A row of hidden_size elements is num_vecs = hidden_size / kVecWidth vectors plus a
// scalar tail of hidden_size % kVecWidth elements. Lane `lane` of the row group owns
// vectors lane, lane + kThreadsPerRow, lane + 2 * kThreadsPerRow, ... in that order,
// whatever kVecsPerThread is, so the per-thread accumulation order (and with it the
// row's bits) depends on kThreadsPerRow and kVecWidth only.
//
// The first kVecsPerThread vectors of a thread are visited with a compile-time slot
// index, so a kernel can keep them in a register array (`cache[slot]`) and reuse them
// in a later pass without reading memory again; vectors past that (rows larger than
// kThreadsPerRow * kVecsPerThread vectors) get slot -1 and are read again.
#pragma once

namespace cupykern {

// Largest block a row kernel is compiled for: kThreadsPerRow for wide rows, else 256
// (rows_per_block groups of kThreadsPerRow). Used in __launch_bounds__ so that the
// register budget matches the block; cupykern/plans.py::max_block_size mirrors it.
template <int kThreadsPerRow>
constexpr int max_block_size() { return kThreadsPerRow > 256 ? kThreadsPerRow : 256; }

template <int kThreadsPerRow, int kVecsPerThread, typename F>
__device__ __forceinline__ void for_each_vec(int64_t num_vecs, int lane, F&& f) {
#pragma unroll
  for (int slot = 0; slot < kVecsPerThread; ++slot) {
    const int64_t v = lane + static_cast<int64_t>(slot) * kThreadsPerRow;
    if (v < num_vecs) f(slot, v);
  }
  // Unrolled so that several loads of the re-read part are in flight at once.
#pragma unroll 4
  for (int64_t v = lane + static_cast<int64_t>(kVecsPerThread) * kThreadsPerRow; v < num_vecs;
       v += kThreadsPerRow) {
    f(-1, v);
  }
}

// Visits the scalar tail [first, hidden_size): at most kVecWidth - 1 elements.
template <int kThreadsPerRow, typename F>
__device__ __forceinline__ void for_each_tail(int64_t first, int64_t hidden_size, int lane, F&& f) {
  for (int64_t i = first + lane; i < hidden_size; i += kThreadsPerRow) f(i);
}

// Position of the calling thread in the block's row groups. Blocks walk the rows
// grid-stride, so any number of rows fits in a 1-D grid.
template <int kThreadsPerRow>
struct RowGroup {
  int lane;            // thread index inside its row group
  int group;           // row group index inside the block
  int rows_per_block;  // blockDim.x / kThreadsPerRow
  __device__ __forceinline__ RowGroup()
      : lane(threadIdx.x % kThreadsPerRow),
        group(threadIdx.x / kThreadsPerRow),
        rows_per_block(blockDim.x / kThreadsPerRow) {}
  __device__ __forceinline__ int64_t first_base() const {
    return static_cast<int64_t>(blockIdx.x) * rows_per_block;
  }
  __device__ __forceinline__ int64_t base_step() const {
    return static_cast<int64_t>(gridDim.x) * rows_per_block;
  }
};

}  // namespace cupykern
