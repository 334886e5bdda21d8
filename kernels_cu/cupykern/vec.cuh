// cupykern/vec.cuh: element conversion and 16-byte vector access.
//
// Storage types are float, __half and __nv_bfloat16. All arithmetic happens in
// fp32: load_* helpers widen to float, store_* helpers round once to the storage
// type with round-to-nearest-even (__float2half_rn / __float2bfloat16_rn).
//
// A "vector" is kVecWidth consecutive elements read or written with one access.
// kVecWidth * sizeof(T) is 16 bytes on the vectorised path and 1 element on the
// scalar path; the caller (cupykern/plans.py) only picks the 16-byte width when
// the base pointer and every row stride are 16-byte aligned.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cupykern {

// NVRTC has no <stdint.h>; the one fixed-width type the kernels use.
using int64_t = long long;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
// bf16 is the top half of a float32: widening is a 16-bit shift of the bits (exact).
// Spelled out because __bfloat162float (CUDA 13's header) costs registers: ptxas gave
// decode_attention's bf16 instantiation 104 registers against fp16's 71, and the
// norm + gate/up GEMV 128 against 102, so fewer of the next kernel's blocks fit beside
// them under programmatic dependent launches (NOTES item 14).
__device__ __forceinline__ float to_float(__nv_bfloat16 v) {
  return __uint_as_float(static_cast<unsigned int>(__bfloat16_as_ushort(v)) << 16);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// kVecWidth elements of T, aligned to their total size so that one load/store
// instruction moves them (16 bytes -> LDG.128 / STG.128).
template <typename T, int kVecWidth>
struct alignas(sizeof(T) * kVecWidth) Vec {
  T elt[kVecWidth];
};

template <typename T, int kVecWidth>
__device__ __forceinline__ Vec<T, kVecWidth> load_vec(const T* ptr) {
  return *reinterpret_cast<const Vec<T, kVecWidth>*>(ptr);
}

// A compiler fence, no instruction: no memory access moves across it, and a store after
// it of a value loaded before it stays (the compiler cannot know the memory unchanged).
__device__ __forceinline__ void loads_issued_here() { asm volatile("" ::: "memory"); }

template <typename T, int kVecWidth>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, kVecWidth>& v) {
  *reinterpret_cast<Vec<T, kVecWidth>*>(ptr) = v;
}

// Element e of a vector, widened to fp32 (exact). e is a compile-time constant in an
// unrolled loop.
template <typename T, int kVecWidth>
__device__ __forceinline__ float element(const Vec<T, kVecWidth>& v, int e) {
  return to_float(v.elt[e]);
}
// bf16 elements 2k and 2k + 1 are one 32-bit word: the even one is the word shifted up 16
// bits, the odd one the word with its low half cleared, one instruction each. Element by
// element the compiler extracted the odd one and shifted it back (two).
template <int kVecWidth>
__device__ __forceinline__ float element(const Vec<__nv_bfloat16, kVecWidth>& v, int e) {
  if constexpr (kVecWidth == 1) {
    return to_float(v.elt[e]);  // the scalar path's one element
  } else {
    const unsigned word = reinterpret_cast<const unsigned*>(&v)[e / 2];
    return __uint_as_float(e % 2 == 0 ? word << 16 : word & 0xffff0000u);
  }
}

// The 16-bit types' two-element vector and its rounding of two fp32 values at once
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: the same rounding as one at a time).
template <typename T> struct PairOf {};
template <> struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type round(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct PairOf<__half> {
  using type = __half2;
  static __device__ __forceinline__ type round(float a, float b) { return __floats2half2_rn(a, b); }
};

// `out` <- kVecWidth fp32 values rounded once to T (round to nearest even). 16-bit types
// round two values with one instruction: the compiler paired the single conversions by
// itself only where the rounded elements were not read again one by one
// (fused_add_rms_norm's sum, which it squares next, took 16 single F2F a thread in bf16
// 256 x 2).
template <typename T, int kVecWidth>
__device__ __forceinline__ void round_into(Vec<T, kVecWidth>& out, const float (&v)[kVecWidth]) {
  if constexpr (sizeof(T) == 2 && kVecWidth % 2 == 0) {
    using Pair = PairOf<T>;
    typename Pair::type* pairs = reinterpret_cast<typename Pair::type*>(&out);
#pragma unroll
    for (int k = 0; k < kVecWidth / 2; ++k) pairs[k] = Pair::round(v[2 * k], v[2 * k + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < kVecWidth; ++e) out.elt[e] = from_float<T>(v[e]);
  }
}

// Rounds kVecWidth fp32 values once to T and writes them with one access.
template <typename T, int kVecWidth>
__device__ __forceinline__ void store_rounded(T* ptr, const float (&v)[kVecWidth]) {
  Vec<T, kVecWidth> out;
  round_into(out, v);
  store_vec<T, kVecWidth>(ptr, out);
}

}  // namespace cupykern
