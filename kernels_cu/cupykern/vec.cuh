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
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

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

template <typename T, int kVecWidth>
__device__ __forceinline__ void store_vec(T* ptr, const Vec<T, kVecWidth>& v) {
  *reinterpret_cast<Vec<T, kVecWidth>*>(ptr) = v;
}

// Rounds kVecWidth fp32 values once to T and writes them with one access.
template <typename T, int kVecWidth>
__device__ __forceinline__ void store_rounded(T* ptr, const float (&v)[kVecWidth]) {
  Vec<T, kVecWidth> out;
#pragma unroll
  for (int e = 0; e < kVecWidth; ++e) out.elt[e] = from_float<T>(v[e]);
  store_vec<T, kVecWidth>(ptr, out);
}

}  // namespace cupykern
