// cupykern/reduce.cuh: row reductions in fp32 whose order is fixed by the row size alone.
//
// The reduction tree (issue 11's design; cupykern/plans.py mirrors every number):
//   leaves   A row of hidden_size elements of T is num_leaves = ceil(hidden_size / L)
//            leaves, one per 16-byte element group (L = 16 / sizeof(T): 8 for fp16 and
//            bf16, 4 for fp32; the last leaf may be partial). A leaf is defined per
//            element group, not per memory access, so the scalar path (kVecWidth = 1)
//            folds the same elements in the same order as the vector path. A leaf's
//            value is Op::identity() combined with its elements' terms in element order.
//   columns  J = min(next_pow2(num_leaves), kMaxTreeColumns) columns; leaf v belongs to
//            column v % J. A column's value is the identity combined with its leaves in
//            increasing v (rows of at most kMaxTreeColumns leaves have one leaf per column).
//   tree     The J column values, padded with the identity, are combined by recursive
//            halving: x[j] <- x[j] op x[j + h] for all j < h, for h = J/2, J/4, ..., 1;
//            the root is x[0]. A pairwise tree (Blelloch-style, "Prefix sums and their
//            applications", 1990), so the error grows with log2(J), not with J.
//
// Why every layout gives the same bits. A row group of P threads (a power of two) with
// A = kVecsPerThread columns per thread and P * A = J (or A = 1 and P >= J) lets lane i
// own columns i, i + P, ..., i + (A - 1) P: it visits leaves i, i + P, i + 2P, ... in
// order (coalesced: the group reads P consecutive leaves at a time), visit m going to
// register column m % A, which is column (i + mP) % J of the tree. The halving stages
// with h >= P combine columns j and j + h of the same lane (registers a and a + h/P);
// the stages with 32 <= h < P combine the same lane of two warps (per-lane partials in
// shared memory: warp w of the group holds columns 32w + l + aP, so the halving over w
// comes before the halving over the lane); the stages with h < 32 are the butterfly
// __shfl_xor_sync(h), h = min(P, 32)/2 ... 1, whose lane 0 combines exactly x[j] op
// x[j + h]. So every (P, A) with P * A = J executes the same operations on the same
// operands. A row of at most kMaxTreeColumns leaves (one leaf per column) also allows
// P * A > J (the extra columns hold the identity) and P * A = J / 2 (a column then folds
// leaves j and j + J/2 in order: the first halving stage). So a row's bits depend on hidden_size and T only: the planner may choose
// the layout from num_tokens (decode rows get many threads, prefill rows few) and the
// result stays bitwise batch-invariant ("batch invariance" as in Thinking Machines Lab,
// "Defeating Nondeterminism in LLM Inference", 2025). Padding is exact: -0.0 + x = x for
// every x (so SumOp's identity is -0.0, not +0.0) and max(-inf, x) = x. Lanes other than
// 0 combine (x[j + h], x[j]); the sum is commutative bit for bit, the NaN-propagating
// max/min are not (signed zeros, NaN payloads), so those broadcast lane 0's root.
// tests/test_reduction_tree.py emulates every layout's schedule in NumPy and checks it.
//
// Every thread of the block must call these functions the same number of times:
// threads whose row index is past the end still take part, with the identity.
#pragma once

namespace cupykern {

// NVRTC has no <math.h>; +inf spelled by its bits.
__device__ __forceinline__ float positive_infinity() { return __int_as_float(0x7f800000); }

// Most columns of the tree (cupykern/plans.py::MAX_TREE_COLUMNS): 1024 threads per row
// times 2 columns each. A 1024-thread block gets at most 64 registers per thread, and
// 4 columns (4 leaves cached) spilled there; 512 x 4 and 256 x 8 reach the same width.
constexpr int kMaxTreeColumns = 2048;

struct SumOp {
  static constexpr bool kCommutative = true;
  // -0.0, the exact identity of IEEE addition (+0.0 + -0.0 is +0.0).
  __device__ __forceinline__ static float identity() { return -0.0f; }
  __device__ __forceinline__ static float apply(float a, float b) { return __fadd_rn(a, b); }
};
// max/min propagate NaN as NumPy does (fmaxf/fminf would drop it, so a row with a
// NaN would report a finite extreme).
struct MaxOp {
  static constexpr bool kCommutative = false;
  __device__ __forceinline__ static float identity() { return -positive_infinity(); }
  __device__ __forceinline__ static float apply(float a, float b) { return (a > b || a != a) ? a : b; }
};
struct MinOp {
  static constexpr bool kCommutative = false;
  __device__ __forceinline__ static float identity() { return positive_infinity(); }
  __device__ __forceinline__ static float apply(float a, float b) { return (a < b || a != a) ? a : b; }
};

// Butterfly reduction over aligned groups of kGroupWidth lanes (a power of two,
// 1..kWarpSize), offsets kGroupWidth / 2 down to 1; every lane of a group ends with the
// group's result (lane 0 of the group with exactly the halving tree's root).
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

// Reduces v over the row group of kThreadsPerRow threads in an order that depends on
// kThreadsPerRow; every thread of the group gets the result. Only for reductions whose
// result does not depend on the order (the max of values without signed zeros or NaN
// payloads, as quant.cu's max |y|); row_tree_reduce is the layout-independent one.
// `scratch` holds one float per warp of the block: a plain buffer, free again on return
// (a trailing barrier guards its reuse), or the next half of a ScratchPair (below: no
// trailing barrier).
template <typename Op, int kThreadsPerRow, int kWarpSize, bool kTrailingBarrier>
__device__ __forceinline__ float row_group_reduce_impl(float v, float* scratch) {
  if constexpr (kThreadsPerRow <= kWarpSize) {
    return warp_reduce<Op, kThreadsPerRow, kWarpSize>(v);
  } else {
    constexpr int kWarpsPerRow = kThreadsPerRow / kWarpSize;
    const int warp = threadIdx.x / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    v = warp_reduce<Op, kWarpSize, kWarpSize>(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int first = (warp / kWarpsPerRow) * kWarpsPerRow;
    float r = scratch[first];
#pragma unroll
    for (int w = 1; w < kWarpsPerRow; ++w) r = Op::apply(r, scratch[first + w]);
    if constexpr (kTrailingBarrier) __syncthreads();
    return r;
  }
}

// x_h[j] of the recursive halving over the kCount values s[0], s[kStride], ...:
// x_kCount[j] = s[j], x_h[j] = x_2h[j] op x_2h[j + h]; the root is x_1[0]. Evaluated
// depth first, so few values are live at once (a 1024-thread row keeps its register
// cache live across this, in at most 64 registers).
template <typename Op, int kCount, int kHalf, int kStride>
__device__ __forceinline__ float halving_subtree(const float* s, int j) {
  if constexpr (kHalf == kCount) {
    return s[j * kStride];
  } else {
    return Op::apply(halving_subtree<Op, kCount, 2 * kHalf, kStride>(s, j),
                     halving_subtree<Op, kCount, 2 * kHalf, kStride>(s, j + kHalf));
  }
}

// From this many warps a row, row_tree_reduce<..., kRootInOneWarp = true> runs the tree's
// last stages in one warp of the row group and broadcasts the root through shared memory
// (a second barrier) instead of in every warp (the same operations on the same operands,
// so the same bits). The caller chooses, by measurement: llama-3.1-70b's 512-thread rows
// at 1-64 tokens took 0.03-0.09 us less in rms_norm and up to 0.10 less in layer_norm,
// but 0.01-0.06 more in fused_add_rms_norm (bench/results/NOTES.md, item 41). quant.cu's
// kernels, untimed with it, do not take it (with it their spills moved).
constexpr int kTreeOneWarpMinWarps = 16;
// The flag as the call sites that take it pass it (a bare `true` names no flag).
constexpr bool kTreeRootInOneWarp = true;

// Floats of shared memory row_tree_reduce needs for a block of at most kMaxBlock threads.
template <int kThreadsPerRow, int kMaxBlock>
constexpr int tree_scratch_floats() { return kThreadsPerRow > 32 ? kMaxBlock : 32; }

// A kernel's reduction scratch in two halves taken in turn, so that the reductions need
// no barrier after their reads. A reduction over several warps writes its half, waits at
// a barrier, then reads it; the next one writes the other half and waits at its own
// barrier. A thread that writes a half again has passed that barrier, which every thread
// reaches only after its reads of the half: no race. Every thread of the block takes the
// same turns (the row loops and the reductions are block-uniform). The trailing barrier
// cost the norms 0.02-0.07 us a call at decode sizes (and fused_add_rms_norm 1-2 %,
// layer_norm at 4096 x 4096 3 % at prefill sizes); softmax measured slower with the pair
// (up to +0.1 us and +3 %), so it keeps one buffer and the barrier, as row_reduce (not
// timed with the pair) does (bench/results/NOTES.md, item 20).
template <int kFloats>
struct ScratchPair {
  float* base;                       // 2 * kFloats floats of shared memory
  int turn;
  __device__ __forceinline__ explicit ScratchPair(float* shared) : base(shared), turn(0) {}
  __device__ __forceinline__ float* next() {
    float* half = base + turn * kFloats;
    turn ^= 1;
    return half;
  }
};

// The tree's root for the row group of kThreadsPerRow threads, each holding its
// kColumns column values (register a = column lane + a * kThreadsPerRow, see above);
// every thread of the group gets the root. `scratch` holds one float per thread of the
// block when kThreadsPerRow > kWarpSize (tree_scratch_floats): a plain buffer, free again
// on return, or the next half of a ScratchPair (no trailing barrier), as row_group_reduce.
template <typename Op, int kThreadsPerRow, int kColumns, int kWarpSize, bool kTrailingBarrier, bool kRootInOneWarp>
__device__ __forceinline__ float row_tree_reduce_impl(float (&column)[kColumns], float* scratch) {
  static_assert((kColumns & (kColumns - 1)) == 0, "columns per thread must be a power of two");
  // Stages h >= kThreadsPerRow: registers a and a + h / kThreadsPerRow of this lane.
#pragma unroll
  for (int half = kColumns / 2; half > 0; half >>= 1) {
#pragma unroll
    for (int a = 0; a < half; ++a) column[a] = Op::apply(column[a], column[a + half]);
  }
  float v = column[0];
  if constexpr (kThreadsPerRow <= kWarpSize) {
    v = warp_reduce<Op, kThreadsPerRow, kWarpSize>(v);
    if constexpr (!Op::kCommutative) v = __shfl_sync(0xffffffffu, v, 0, kThreadsPerRow);
    return v;
  } else {
    // Stages kWarpSize <= h < kThreadsPerRow: lane l of warp w of the group holds column
    // w * kWarpSize + l; halve over w with the per-lane partials in shared memory.
    constexpr int kWarpsPerRow = kThreadsPerRow / kWarpSize;
    const int lane = threadIdx.x % kWarpSize;
    const int group = (threadIdx.x / kThreadsPerRow) * kThreadsPerRow;
    scratch[threadIdx.x] = v;
    __syncthreads();
    // The tree's last stages, in the calling warp: the group's partials, then the warp.
    auto finish_in_this_warp = [&] {
      return warp_reduce<Op, kWarpSize, kWarpSize>(
          halving_subtree<Op, kWarpsPerRow, 1, kWarpSize>(scratch + group + lane, 0));
    };
    if constexpr (kRootInOneWarp && kWarpsPerRow >= kTreeOneWarpMinWarps) {
      // The group's first warp finishes the tree and leaves the root in scratch[group],
      // which only its lane 0 read; the other warps wait at a second barrier. Where every
      // warp finishes it, each reads kWarpsPerRow partials: kWarpsPerRow^2 warp-wide
      // shared loads (256 for a 512-thread row, through a pipe that takes one a cycle);
      // here one warp reads kWarpsPerRow, and each warp the root once.
      if (threadIdx.x - group < kWarpSize) {
        v = finish_in_this_warp();
        if (lane == 0) scratch[group] = v;  // lane 0's root, as the broadcast below
      }
      __syncthreads();
      v = scratch[group];
    } else {
      v = finish_in_this_warp();
      if constexpr (!Op::kCommutative) v = __shfl_sync(0xffffffffu, v, 0, kWarpSize);
    }
    if constexpr (kTrailingBarrier) __syncthreads();
    return v;
  }
}

// The entry points: the scratch's type says whether the trailing barrier is needed.
template <typename Op, int kThreadsPerRow, int kWarpSize = 32>
__device__ __forceinline__ float row_group_reduce(float v, float* scratch) {
  return row_group_reduce_impl<Op, kThreadsPerRow, kWarpSize, true>(v, scratch);
}
template <typename Op, int kThreadsPerRow, int kWarpSize = 32, int kFloats>
__device__ __forceinline__ float row_group_reduce(float v, ScratchPair<kFloats>& scratch) {
  return row_group_reduce_impl<Op, kThreadsPerRow, kWarpSize, false>(v, scratch.next());
}
template <typename Op, int kThreadsPerRow, int kColumns, int kWarpSize = 32, bool kRootInOneWarp = false>
__device__ __forceinline__ float row_tree_reduce(float (&column)[kColumns], float* scratch) {
  return row_tree_reduce_impl<Op, kThreadsPerRow, kColumns, kWarpSize, true, kRootInOneWarp>(column, scratch);
}
template <typename Op, int kThreadsPerRow, int kColumns, int kWarpSize = 32, bool kRootInOneWarp = false,
          int kFloats>
__device__ __forceinline__ float row_tree_reduce(float (&column)[kColumns], ScratchPair<kFloats>& scratch) {
  return row_tree_reduce_impl<Op, kThreadsPerRow, kColumns, kWarpSize, false, kRootInOneWarp>(column, scratch.next());
}

}  // namespace cupykern
