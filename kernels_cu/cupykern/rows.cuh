// cupykern/rows.cuh: how a row group of threads walks its row, leaf by leaf.
//
// A row of hidden_size elements of T is num_leaves = ceil(hidden_size / L) leaves of
// L = 16 / sizeof(T) elements (the last one may be partial): the leaves of the reduction
// tree (cupykern/reduce.cuh). A leaf is read with one 16-byte access when kVecWidth == L
// and the leaf is whole, else element by element; either way the kernel sees the same
// Vec<T, L> (elements past the row's end are zero and are not folded).
//
// Lane `lane` of the row group owns leaves lane, lane + kThreadsPerRow, lane + 2 *
// kThreadsPerRow, ... and visits them in that order; visit m goes to register column
// m % kColumns. The first round (m < kColumns) is visited with a compile-time slot
// index m, so a kernel can keep those leaves in a register array (`cache[slot]`) and
// reuse them in a later pass without reading memory again; later rounds (rows of more
// than kThreadsPerRow * kColumns leaves) get slot -1 and are read again.
#pragma once
#include <cupykern/vec.cuh>

namespace cupykern {

// Largest block a row kernel is compiled for: kThreadsPerRow for wide rows, else 256
// (rows_per_block groups of kThreadsPerRow). Used in __launch_bounds__ so that the
// register budget matches the block; cupykern/plans.py::max_block_size mirrors it.
template <int kThreadsPerRow>
constexpr int max_block_size() { return kThreadsPerRow > 256 ? kThreadsPerRow : 256; }

// Elements of T per leaf: one 16-byte element group (cupykern/plans.py::leaf_width).
template <typename T>
constexpr int leaf_width() { return 16 / static_cast<int>(sizeof(T)); }

// Leaf v of `row` (count elements of it in the row); the rest of the Vec is zero.
template <typename T, int kVecWidth>
__device__ __forceinline__ Vec<T, leaf_width<T>()> load_leaf(const T* row, int64_t v, int count) {
  constexpr int L = leaf_width<T>();
  if constexpr (kVecWidth == L) {
    if (count == L) return load_vec<T, L>(row + v * L);
  }
  Vec<T, L> a;
#pragma unroll
  for (int e = 0; e < L; ++e) a.elt[e] = e < count ? row[v * L + e] : from_float<T>(0.0f);
  return a;
}

// Eviction priorities of a load (PTX `ld.global.L1::evict_*.L2::cache_hint` with a
// `createpolicy.fractional.L2::evict_*` policy, sm_80 and later): what Triton emits on
// sm_90 for tl.load(..., eviction_policy="evict_last" / "evict_first"), and what
// Inductor's rms_norm asks for when it reads a row twice (bench/results/NOTES.md, item 26).
enum class Evict { kNormal, kLast, kFirst };

// Both PTX forms need sm_80; below it the loads are plain ones (the same bits, no hint).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CUPYKERN_L2_HINTS 1
#else
#define CUPYKERN_L2_HINTS 0
#endif

// The L2 policy operand of load_leaf_evict (unused for kNormal).
template <Evict E>
__device__ __forceinline__ unsigned long long l2_policy() {
  unsigned long long policy = 0;
#if CUPYKERN_L2_HINTS
  if constexpr (E == Evict::kLast) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else if constexpr (E == Evict::kFirst) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
#endif
  return policy;
}

// load_leaf, a whole leaf on the vector path read with eviction priority E (`policy` from
// l2_policy<E>()); a partial leaf, the scalar path, kNormal and GPUs before sm_80 read
// as load_leaf does.
template <typename T, int kVecWidth, Evict E>
__device__ __forceinline__ Vec<T, leaf_width<T>()> load_leaf_evict(const T* row, int64_t v, int count,
                                                                   unsigned long long policy) {
  constexpr int L = leaf_width<T>();
#if CUPYKERN_L2_HINTS
  if constexpr (kVecWidth == L && E != Evict::kNormal) {
    if (count == L) {
      Vec<T, L> a;
      unsigned* w = reinterpret_cast<unsigned*>(&a);
      const T* p = row + v * L;
      if constexpr (E == Evict::kLast) {
        asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy));
      } else {
        asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(policy));
      }
      return a;
    }
  }
#endif
  return load_leaf<T, kVecWidth>(row, v, count);
}

template <typename T, int kVecWidth>
__device__ __forceinline__ void store_leaf(T* row, int64_t v, int count, const Vec<T, leaf_width<T>()>& a) {
  constexpr int L = leaf_width<T>();
  if constexpr (kVecWidth == L) {
    if (count == L) {
      store_vec<T, L>(row + v * L, a);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < L; ++e) {
    if (e < count) row[v * L + e] = a.elt[e];
  }
}

// Hands the values y of leaf v (count elements of it in the row) to an epilogue:
// vec_fn(i, y) once for a whole leaf on the vector path (float y[L], elements i ..
// i + L - 1, 16-byte aligned in the row), else tail_fn(i, y[e]) per element.
template <typename T, int kVecWidth, typename VecFn, typename TailFn>
__device__ __forceinline__ void emit_leaf(int64_t v, int count, const float (&y)[leaf_width<T>()], VecFn&& vec_fn,
                                          TailFn&& tail_fn) {
  constexpr int L = leaf_width<T>();
  if constexpr (kVecWidth == L) {
    if (count == L) {
      vec_fn(v * L, y);
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < L; ++e) {
    if (e < count) tail_fn(v * L + e, y[e]);
  }
}

// Stores the fp32 values y of whole leaf v of a 16-bit row (L = 8: 32 bytes), lanes 2j
// and 2j + 1 holding leaves v and v + 1 (adjacent: lane-ordered leaves, an even number of
// threads a row, both lanes in the loop: the exact walk with a warp inside one row).
// Each lane sends its partner the half that lies in the partner's store, so each of the
// two 16-byte store instructions writes whole 32-byte sectors: the even lanes' leaves,
// then the odd lanes'. Stored as they are, each instruction wrote half of 32 sectors,
// which doubled the sectors the stores sent to L2 and left the warps waiting for them to
// drain at exit (ncu on softmax at 256 rows, bench/results/NOTES.md, item 41). The same
// values to the same addresses; whole sectors where the row starts 32-byte aligned (the
// vector path needs 16: a row at 16 mod 32 straddles sectors as before).
__device__ __forceinline__ void store_fp32_leaf_paired(float* row, int64_t v, const float (&y)[8], int lane) {
  const bool odd = lane & 1;
  float theirs[4];  // the half of the partner's leaf that this lane stores
#pragma unroll
  for (int e = 0; e < 4; ++e) theirs[e] = __shfl_xor_sync(0xffffffffu, odd ? y[e] : y[e + 4], 1);
  // Even lane: its y[0..3] at leaf v, the partner's y[0..3] at leaf v + 1. Odd lane (v is
  // the partner's + 1): the partner's y[4..7] at leaf v - 1, its own y[4..7] at leaf v.
  float* p = row + v * 8 - (odd ? 4 : 0);
  const float4 first = odd ? make_float4(theirs[0], theirs[1], theirs[2], theirs[3])
                           : make_float4(y[0], y[1], y[2], y[3]);
  const float4 second = odd ? make_float4(y[4], y[5], y[6], y[7])
                            : make_float4(theirs[0], theirs[1], theirs[2], theirs[3]);
  *reinterpret_cast<float4*>(p) = first;
  *reinterpret_cast<float4*>(p + 8) = second;
}

// A leaf's value: Op::identity() combined with step(s, x) over its elements in order,
// x the element as float (count of them; all L when the leaf is whole). The same code
// for every layout and both access paths, so a leaf's bits depend on its elements only.
template <typename Op, typename T, typename Step>
__device__ __forceinline__ float fold_leaf(const Vec<T, leaf_width<T>()>& a, int count, Step&& step) {
  constexpr int L = leaf_width<T>();
  float s = Op::identity();
  if (count == L) {
#pragma unroll
    for (int e = 0; e < L; ++e) s = step(s, element(a, e));
  } else {
#pragma unroll
    for (int e = 0; e < L; ++e) {
      if (e < count) s = step(s, element(a, e));
    }
  }
  return s;
}

// column[col] <- Op(column[col], value). For the whole leaves col is a compile-time
// constant once for_each_leaf is unrolled, so this is one operation; for the partial
// leaf it is kColumns predicated ones, and the array never needs a dynamic index.
template <typename Op, int kColumns>
__device__ __forceinline__ void add_to_column(float (&column)[kColumns], int col, float value) {
#pragma unroll
  for (int a = 0; a < kColumns; ++a) {
    if (a == col) column[a] = Op::apply(column[a], value);
  }
}

// Visits this lane's leaves of a row of hidden_size elements (see the header):
// f(slot, column, v, count). Whole leaves come first, with count = L (a constant, so the
// callee's vector path is straight-line code); a partial last leaf (count < L) comes
// last, which is its place in its column's order too (it has the row's largest index),
// with slot -1 and a runtime column: callers update columns with add_to_column, which
// keeps the register array statically indexed either way.
// kExact: the caller guarantees hidden_size == kThreadsPerRow * kColumns * L (the layout
// fills the row exactly: plans.RowLayout.fills), so the lane has exactly kColumns whole
// leaves, no later round and no partial leaf, and no bounds are computed before the
// loads. The same leaves in the same order, so the same bits. rms_norm at 1-64 tokens of
// llama-3.1-8b / -70b: mostly 0.08-0.13 us less a call, 2.2-4.9 % less at 4096 (NOTES
// item 22).
template <typename T, int kThreadsPerRow, int kColumns, bool kExact = false, typename F>
__device__ __forceinline__ void for_each_leaf(int64_t hidden_size, bool active, int lane, F&& f) {
  constexpr int L = leaf_width<T>();
  if constexpr (kExact) {
    if (!active) return;
#pragma unroll
    for (int a = 0; a < kColumns; ++a) f(a, a, lane + a * kThreadsPerRow, L);
    return;
  }
  const int64_t num_whole = active ? hidden_size / L : 0;
#pragma unroll
  for (int a = 0; a < kColumns; ++a) {
    const int64_t v = lane + static_cast<int64_t>(a) * kThreadsPerRow;
    if (v < num_whole) f(a, a, v, L);
  }
  constexpr int64_t kRound = static_cast<int64_t>(kColumns) * kThreadsPerRow;
  for (int64_t first = lane + kRound; first < num_whole; first += kRound) {
#pragma unroll
    for (int a = 0; a < kColumns; ++a) {
      const int64_t v = first + static_cast<int64_t>(a) * kThreadsPerRow;
      if (v < num_whole) f(-1, a, v, L);
    }
  }
  const int rest = active ? static_cast<int>(hidden_size - num_whole * L) : 0;
  if (rest != 0 && lane == num_whole % kThreadsPerRow) {
    f(-1, static_cast<int>((num_whole / kThreadsPerRow) % kColumns), num_whole, rest);
  }
}

// Visits this lane's whole leaves of the first round, f(a, v) for leaf v = lane + a *
// kThreadsPerRow, a < kColumns (a compile-time index once unrolled): the leaves
// for_each_leaf gives slot a. kExact as there (here and in the two loaders below).
template <typename T, int kThreadsPerRow, int kColumns, bool kExact = false, typename F>
__device__ __forceinline__ void for_each_first_round_leaf(int64_t hidden_size, bool active, int lane, F&& f) {
  if constexpr (kExact) {
    if (!active) return;
#pragma unroll
    for (int a = 0; a < kColumns; ++a) f(a, lane + a * kThreadsPerRow);
    return;
  }
  const int64_t num_whole = active ? hidden_size / leaf_width<T>() : 0;
#pragma unroll
  for (int a = 0; a < kColumns; ++a) {
    const int64_t v = lane + static_cast<int64_t>(a) * kThreadsPerRow;
    if (v < num_whole) f(a, v);
  }
}

// Loads this lane's whole leaves of the first round, cache[a] = load(v) for leaf
// v = lane + a * kThreadsPerRow, all requested before any is used; the pass that folds
// them then takes them from the cache (slot >= 0). Inside for_each_leaf each load sat
// behind the branch and fold of the leaf before, one 16-byte load in flight (rms_norm
// bf16 at 16384 x 4096: 82 us against 67). A branch-free first round inside for_each_leaf
// spilled in some layouts instead, so the kernels that load the row call this first.
template <typename T, int kThreadsPerRow, bool kExact = false, int kColumns, typename V, typename Load>
__device__ __forceinline__ void load_first_round(int64_t hidden_size, bool active, int lane, V (&cache)[kColumns],
                                                 Load&& load) {
  for_each_first_round_leaf<T, kThreadsPerRow, kColumns, kExact>(hidden_size, active, lane,
                                                                 [&](int a, int64_t v) { cache[a] = load(v); });
}

// `p`, hidden from the optimiser here (no instruction is emitted), so loads through the
// result stay where they are written. The row kernels request the weights through it
// with each row's leaves: a weight load before the row loop, or one the compiler
// hoisted there as loop-invariant, took the work on the weights (w + weight_offset, the
// widening to fp32) out of the loop with it, and that work waited for the weights
// before the row's loads were issued: one more memory round trip a call.
template <typename T>
__device__ __forceinline__ const T* pinned(const T* p) {
  asm volatile("" : "+l"(p));
  return p;
}

// `v`, hidden from the optimiser here (no instruction is emitted): the registers twin of
// pinned. Work on v written after this point stays after it, so a value loaded before a
// row loop is not widened (and waited for) before the loop either.
template <typename T, int L>
__device__ __forceinline__ void pin_value(Vec<T, L>& v) {
  static_assert(sizeof(Vec<T, L>) % 4 == 0, "pin_value takes whole 32-bit words");
  unsigned* words = reinterpret_cast<unsigned*>(&v);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Vec<T, L>) / 4); ++k) asm volatile("" : "+r"(words[k]));
}

// Whether a layout also keeps the first round of the per-column vectors (weight, bias)
// in registers, loaded before the row's first barrier: at decode sizes the kernel is
// one chain of latencies, and a weight load after the reduction added an L2 round trip
// to it. Layouts of at most 2 leaves a thread (the decode layouts, plans.py::
// DECODE_VECS_PER_THREAD) do; those of more serve prefill sizes, where other warps hide
// that load and the registers would cost occupancy; 1024-thread blocks (64 registers a
// thread) spilled.
template <int kThreadsPerRow, int kVecsPerThread>
constexpr bool caches_weights() { return kVecsPerThread <= 2 && max_block_size<kThreadsPerRow>() <= 512; }

// Whether a row kernel runs its decode layouts one row a block (RowGroup's
// kOneRowPerBlock): row groups of at least max_block_size threads (the block is then one
// row group, by the launch contract), blocks of at most 512 threads, at most 2 leaves a
// thread (plans.py::DECODE_VECS_PER_THREAD) and the vector path. sm_90 SASS of
// rms_norm_kernel<bf16, 256, 8, 2, 32, true>: 360 -> 305 instructions, its first x load at
// instruction 50 -> 28; at 1-64 tokens of llama-3.1-8b / -70b rms_norm -0.14..-0.24 us a
// call, layer_norm -0.07..-0.20, row_reduce -0.02..-0.07 (bench/results/NOTES.md, item
// 23). Not past 2 leaves a thread: rms_norm's 256 x 4 exact layout then took 64 registers
// instead of 44 (4 blocks an SM instead of 5) and 4 % longer at 4096 tokens of
// llama-3.1-70b, and the prefill instantiations stay as they were timed. Not in 1024-thread
// blocks nor on the scalar path (kVecWidth 1): there (row_reduce fp16 1024 x 2 on sm_90,
// layer_norm fp32 512 x 1 x 2 on sm_89, the per-token FP8 norm fp16 256 x 1 x 2 on sm_80)
// ptxas settled on fewer registers and spilled 4-16 bytes. max_vecs_per_thread: softmax's
// exact walk takes it up to 8 (see there); the fused add takes it in its exact walk only,
// with its weights loaded before the row loop (see rms_norm_rows.cuh).
template <typename T, int kThreadsPerRow, int kVecsPerThread, int kVecWidth>
constexpr bool one_row_per_block(int max_vecs_per_thread = 2) {
  return kThreadsPerRow >= max_block_size<kThreadsPerRow>() && max_block_size<kThreadsPerRow>() <= 512 &&
         kVecsPerThread <= max_vecs_per_thread && kVecWidth == leaf_width<T>();
}

// The first round of a [hidden_size] vector shared by every row (weight, bias) for the
// layouts above: cache[a] = leaf lane + a * kThreadsPerRow of `p` (nothing loaded when p
// is null: callers test it). Called per row, with the row's loads (see pinned).
template <typename T, int kThreadsPerRow, int kVecWidth, bool kExact = false, int kColumns>
__device__ __forceinline__ void load_shared_first_round(const T* p, int64_t hidden_size, int lane,
                                                        Vec<T, leaf_width<T>()> (&cache)[kColumns]) {
  if (p == nullptr) return;
  p = pinned(p);
  load_first_round<T, kThreadsPerRow, kExact>(hidden_size, true, lane, cache,
                                              [&](int64_t v) { return load_leaf<T, kVecWidth>(p, v, leaf_width<T>()); });
}

// Leaf v of a per-column vector (weight, bias): the register copy of a first-round slot
// when the layout caches it (kCached, from caches_weights), else read from p.
template <bool kCached, typename T, int kVecWidth, int kColumns>
__device__ __forceinline__ Vec<T, leaf_width<T>()> shared_leaf(const T* p,
                                                              const Vec<T, leaf_width<T>()> (&cache)[kColumns],
                                                              int slot, int64_t v, int count) {
  if constexpr (kCached) {
    if (slot >= 0) return cache[slot];
  }
  return load_leaf<T, kVecWidth>(p, v, count);
}

// Vector-by-vector walk of rope.cu's heads (no reduction tree there: a head's row group
// is fixed by head_dim): lane owns vectors lane, lane + kThreadsPerRow, ... in order;
// the first kVecsPerThread get a compile-time slot, later ones slot -1.
template <int kThreadsPerRow, int kVecsPerThread, typename F>
__device__ __forceinline__ void for_each_vec(int64_t num_vecs, int lane, F&& f) {
#pragma unroll
  for (int slot = 0; slot < kVecsPerThread; ++slot) {
    const int64_t v = lane + static_cast<int64_t>(slot) * kThreadsPerRow;
    if (v < num_vecs) f(slot, v);
  }
#pragma unroll 4
  for (int64_t v = lane + static_cast<int64_t>(kVecsPerThread) * kThreadsPerRow; v < num_vecs;
       v += kThreadsPerRow) {
    f(-1, v);
  }
}

// Position of the calling thread in the block's row groups. Blocks walk the rows
// grid-stride, so any number of rows fits in a 1-D grid.
// kOneRowPerBlock (see one_row_per_block): the block is one row group, so lane is
// threadIdx.x, group 0 and rows_per_block 1 at compile time, and a kernel's row is its
// loop's base: its `row < num_rows` test (`active`) is then the loop's own condition,
// which the compiler drops with its branch before the row's first load.
template <int kThreadsPerRow, bool kOneRowPerBlock = false>
struct RowGroup {
  static_assert(!kOneRowPerBlock || kThreadsPerRow >= max_block_size<kThreadsPerRow>(),
                "one row a block needs a row group as wide as the largest block");
  int lane;            // thread index inside its row group
  int group;           // row group index inside the block
  int rows_per_block;  // blockDim.x / kThreadsPerRow
  __device__ __forceinline__ RowGroup()
      : lane(kOneRowPerBlock ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x % kThreadsPerRow)),
        group(kOneRowPerBlock ? 0 : static_cast<int>(threadIdx.x / kThreadsPerRow)),
        rows_per_block(kOneRowPerBlock ? 1 : static_cast<int>(blockDim.x / kThreadsPerRow)) {}
  __device__ __forceinline__ int64_t first_base() const {
    return static_cast<int64_t>(blockIdx.x) * rows_per_block;
  }
  __device__ __forceinline__ int64_t base_step() const {
    return static_cast<int64_t>(gridDim.x) * rows_per_block;
  }
};

}  // namespace cupykern
