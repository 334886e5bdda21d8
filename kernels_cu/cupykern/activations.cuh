// cupykern/activations.cuh: the gate activations, as fp32 device functions.
//
// One definition each (PyTorch's names and formulas):
//   silu(g)      = g * sigmoid(g)            = g / (1 + exp(-g))
//   gelu_erf(g)  = g * Phi(g)                = 0.5 * g * erfc(-g / sqrt(2))
//   gelu_tanh(g) = 0.5 * g * (1 + tanh(u)),  u = sqrt(2 / pi) * (g + 0.044715 * g^3)
//                = g / (1 + exp(-2 u))       (0.5 * (1 + tanh(u)) == sigmoid(2 u))
// Sources: SiLU, Elfwing, Uchibe & Doya 2017 (arXiv:1702.03118); GELU and its tanh
// approximation, Hendrycks & Gimpel 2016 (arXiv:1606.08415).
//
// Numerics: erfc(-x) and the sigmoid form replace 1 + erf(x) and 1 + tanh(u), which
// cancel to 0 for g below about -4; the forms used keep full relative accuracy in the
// negative tail. For finite g the formulas cannot produce NaN: when exp(-g) overflows
// to inf, g / inf is -0 (the limit). The one input that would give NaN (-inf / inf,
// -inf * 0) is g = -inf, which returns its limit -0 explicitly. +inf gives +inf; NaN
// stays NaN.
//
// Two precisions, chosen at compile time (kFast): accurate libdevice functions for
// fp32 outputs, fast intrinsics for fp16/bf16 outputs (cupykern/fastmath.cuh gives
// their accuracy). The accurate forms cost ~30 instructions per element and made
// 16384 x 14336 bf16 silu_and_mul instruction-bound (86% of copy), gelu_and_mul
// (erfcf) 48%. __fdividef(g, y) returns 0 for 2^126 < y < 2^128 (g in about [-88.7,
// -87.3]), where the quotient is below 1e-36: it rounds to 0 in fp16, and bf16's
// error of 1e-36 is far under any tolerance.
//
// kAct selects an activation at compile time (activate<kAct, kFast>); the values match
// cupykern/ops/activation.py::ACTIVATIONS.
#pragma once
#include <cupykern/fastmath.cuh>

namespace cupykern {

constexpr int kActSilu = 0;
constexpr int kActGeluErf = 1;
constexpr int kActGeluTanh = 2;

// NVRTC has no <math.h>; -inf spelled by its bits.
__device__ __forceinline__ bool is_negative_infinity(float g) { return g == -__int_as_float(0x7f800000); }

// The value at g = -inf, -0, in place of `value` (NaN there). A select, not a branch:
// the value is computed for every g first. Written `g == -inf ? -0 : f(g)`, the
// compiler branched around f for each element, which serialised the elements of a
// vector (one dependent chain each) and made decode-size calls latency-bound
// (bench/results/NOTES.md, item 16).
__device__ __forceinline__ float negative_infinity_limit(float g, float value) {
  return is_negative_infinity(g) ? -0.0f : value;
}

// g * sigmoid(t), written as a quotient so that exp(-t) overflowing gives -0 or +0.
template <bool kFast>
__device__ __forceinline__ float mul_sigmoid(float g, float t) {
  return negative_infinity_limit(g, quotient<kFast>(g, 1.0f + exp_of<kFast>(-t)));
}

template <bool kFast>
__device__ __forceinline__ float silu(float g) { return mul_sigmoid<kFast>(g, g); }

template <bool kFast>
__device__ __forceinline__ float gelu_erf(float g) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;
  return negative_infinity_limit(g, 0.5f * g * erfc_of<kFast>(-g * kSqrtHalf));
}

template <bool kFast>
__device__ __forceinline__ float gelu_tanh(float g) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  const float u = kSqrt2OverPi * (g + 0.044715f * g * g * g);
  return mul_sigmoid<kFast>(g, 2.0f * u);
}

template <int kAct, bool kFast>
__device__ __forceinline__ float activate(float g) {
  static_assert(kAct == kActSilu || kAct == kActGeluErf || kAct == kActGeluTanh,
                "kAct must be kActSilu (0), kActGeluErf (1) or kActGeluTanh (2)");
  if constexpr (kAct == kActSilu) {
    return silu<kFast>(g);
  } else if constexpr (kAct == kActGeluErf) {
    return gelu_erf<kFast>(g);
  } else {
    return gelu_tanh<kFast>(g);
  }
}

}  // namespace cupykern
