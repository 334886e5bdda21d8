// cupykern/fp8.cuh: fp32 -> FP8 E4M3FN, the one rounding of the quantising kernels.
//
// E4M3FN (OCP 8-bit Floating Point Specification (OFP8), rev. 1.0, 2023; NVIDIA's
// __NV_E4M3): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, NaN is
// S.1111.111 (0x7f / 0xff); largest finite 448 (0x7e), smallest normal 2^-6, smallest
// subnormal 2^-9.
//
// to_e4m3fn(v) is __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3) from <cuda_fp8.h>:
// round to nearest even, then saturate: every |v| above 448, infinities included,
// gives +-448 (0x7e / 0xfe), NaN gives NaN (0x7f, with v's sign on sm_80: the
// software path of cuda_fp8.hpp ORs the sign in). On sm_89+ it is one PTX
// `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA: .rn round to nearest even; .satfinite clamps
// to the largest finite value, NaN stays NaN); below sm_89 cuda_fp8.hpp converts exactly
// through double with the same rounding. Storage is unsigned char (the bit pattern).
#pragma once
#include <cuda_fp8.h>
#include <cupykern/vec.cuh>

namespace cupykern {

// The largest finite E4M3FN value.
constexpr float kE4m3fnMax = 448.0f;

__device__ __forceinline__ unsigned char to_e4m3fn(float v) {
  return static_cast<unsigned char>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// Quantises N fp32 values as round_e4m3fn(y * inv_scale) and writes them with one N-byte
// access (ptr aligned to N bytes). The quantising kernels pass inv_scale = 1.0f / scale
// (__frcp_rn, correctly rounded, once per thread and row), as vLLM's static-scale kernels do:
// the product y * inv_scale is rounded to fp32, then once to E4M3FN. A division per
// element made the slow-path call of the IEEE division spill registers in the
// heuristic layouts (rms_norm_quant, bf16, hidden 4096, sm_90: 6 bytes).
template <int N>
__device__ __forceinline__ void store_e4m3fn(unsigned char* ptr, const float (&y)[N], float inv_scale) {
  Vec<unsigned char, N> out;
#pragma unroll
  for (int e = 0; e < N; ++e) out.elt[e] = to_e4m3fn(y[e] * inv_scale);
  store_vec<unsigned char, N>(ptr, out);
}

}  // namespace cupykern
