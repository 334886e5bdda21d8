// cupykern/fastmath.cuh: exp, division and erfc in two precisions, chosen at compile time.
//
//   kFast = false (fp32 outputs): libdevice expf, erfcf and IEEE division, a few ulp.
//   kFast = true (fp16 / bf16 outputs):
//     exp_of    __expf: ex2.approx of x * log2(e); relative error at most
//               (2 + 1.17 |x|) ulp of fp32, under 2^-17 for the |x| < 88 where the
//               result is a normal float (CUDA C Programming Guide, intrinsic functions).
//     quotient  __fdividef: rcp.approx then a multiply, 2 ulp; returns 0 when
//               2^126 < |b| < 2^128 (callers say why that is harmless for them).
//     erfc_of   Numerical Recipes' erfcc (Press et al., Numerical Recipes in C, 2nd ed.,
//               sec. 6.2): t * exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z = |x|, a
//               Chebyshev fit with relative error below 1.2e-7, then erfc(x) = 2 -
//               erfc(-x) for x < 0. In fp32 with __expf: relative error below 1.3e-5
//               wherever erfc(x) is a normal float (checked against math.erfc on
//               [-6, 10]); the error grows with z^2 through the rounding of -z^2.
//   Each stays below 2^-16 relative, under 1/32 of an fp16 ulp (2^-11) and 1/256 of a
//   bf16 ulp (2^-8): the rounded 16-bit output matches the accurate form's except
//   where the exact value lies that close to a rounding boundary. Results that
//   underflow fp32's normal range flush to 0 (the kernels build with -ftz=true).
#pragma once

namespace cupykern {

template <bool kFast>
__device__ __forceinline__ float exp_of(float x) {
  if constexpr (kFast) return __expf(x);
  else return expf(x);
}

template <bool kFast>
__device__ __forceinline__ float quotient(float a, float b) {
  if constexpr (kFast) return __fdividef(a, b);
  else return a / b;
}

// erfc(x), for the fast path: Numerical Recipes' erfcc, t * exp(-x^2 + P(t)) with
// t = 1 / (1 + |x| / 2), then erfc(x) = 2 - erfc(-x) for x < 0. Relative error
// below 1.2e-7 for x >= 0 (and absolute below 2.4e-7 for x < 0, where erfc >= 1).
__device__ __forceinline__ float erfc_fast(float x) {
  const float z = fabsf(x);
  const float t = __fdividef(1.0f, 1.0f + 0.5f * z);
  const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f +
                  t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  const float r = t * __expf(-z * z + p);
  return x >= 0.0f ? r : 2.0f - r;
}

template <bool kFast>
__device__ __forceinline__ float erfc_of(float x) {
  if constexpr (kFast) return erfc_fast(x);
  else return erfcf(x);
}

}  // namespace cupykern
