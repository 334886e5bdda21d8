// activation.cu: gated activations act(gate) * up (silu_and_mul, gelu_and_mul, swiglu).
//
// Math (fp32, one rounding to T at the store):
//   out[r, i] = act(gate[r, i]) * up[r, i],   0 <= i < d
//   act = silu (g / (1 + exp(-g))), gelu_erf (g * Phi(g)) or gelu_tanh (the tanh
//   approximation); definitions and their tail handling in cupykern/activations.cuh.
// Sources: GLU variants (SwiGLU, GeGLU), Shazeer 2020 (arXiv:2002.05202); SiLU,
// Elfwing et al. 2017 (arXiv:1702.03118); GELU, Hendrycks & Gimpel 2016
// (arXiv:1606.08415). silu_and_mul / gelu_and_mul take the fused gate_up layout of
// vLLM's silu_and_mul: x = [gate | up] along the last axis, so the wrapper passes
// gate = x, up = x + d, both with x's row stride; swiglu passes two arrays.
//
// Layout: num_rows rows of d elements, unit stride along a row; gate, up and out rows
// are *_row_stride elements apart (64-bit offsets), so slices of wider buffers work.
// Mutates: `out` only. out may be gate or up exactly (each element is read and then
// written by the same thread); it must not partially overlap them (checked in Python).
//
// Template parameters:
//   T          float, __half, __nv_bfloat16
//   kAct       0 silu, 1 gelu (erf), 2 gelu (tanh approximation)
//   kVecWidth  1 or 16 / sizeof(T): elements per memory access. 16 / sizeof(T) only
//              when gate, up and out pointers are 16-byte aligned and every row stride
//              is a multiple of kVecWidth; the last d % kVecWidth elements of a row go
//              through a scalar tail.
// Launch contract (planned by cupykern/plans.py::plan_activation): 1-D block of
// block_size threads (a multiple of 32, at most kActMaxBlockSize); 1-D grid of any size
// over (row, chunk) work items, walked grid-stride, so any number of rows fits. A row
// is ceil(d / kVecWidth) slots (the last may be the scalar tail); a chunk is
// block_size consecutive slots, one per thread. No shared memory.
#include <cupykern/vec.cuh>
#include <cupykern/activations.cuh>

using namespace cupykern;

// __launch_bounds__ of the kernel; cupykern/plans.py::ACTIVATION_MAX_BLOCK_SIZE mirrors it.
constexpr int kActMaxBlockSize = 1024;

// ---------------------------------------------------------------- act_and_mul
template <typename T, int kAct, int kVecWidth>
__global__ void __launch_bounds__(kActMaxBlockSize) act_and_mul_kernel(
    T* out,                          // [num_rows, d], out_row_stride apart
    const T* gate,                   // [num_rows, d], gate_row_stride apart
    const T* up,                     // [num_rows, d], up_row_stride apart
    int64_t num_rows, int64_t d, int64_t gate_row_stride, int64_t up_row_stride,
    int64_t out_row_stride) {
  using V = Vec<T, kVecWidth>;
  // 16-bit outputs use the fast intrinsics (cupykern/activations.cuh says why and how
  // accurate); fp32 outputs the accurate libdevice functions.
  constexpr bool kFastMath = sizeof(T) == 2;
  const int64_t slots_per_row = (d + kVecWidth - 1) / kVecWidth;
  const int64_t chunks_per_row = (slots_per_row + blockDim.x - 1) / blockDim.x;
  const int64_t num_chunks = num_rows * chunks_per_row;

  // Position of this block's first work item, then a division-free grid-stride walk:
  // the step of gridDim.x chunks is step_rows rows plus step_chunks chunks.
  int64_t row = blockIdx.x / chunks_per_row;
  int64_t chunk = blockIdx.x - row * chunks_per_row;
  const int64_t step_rows = gridDim.x / chunks_per_row;
  const int64_t step_chunks = gridDim.x - step_rows * chunks_per_row;

  for (int64_t work = blockIdx.x; work < num_chunks; work += gridDim.x) {
    const int64_t slot = chunk * blockDim.x + threadIdx.x;
    if (slot < slots_per_row) {
      const int64_t i = slot * kVecWidth;
      const T* gate_row = gate + row * gate_row_stride;
      const T* up_row = up + row * up_row_stride;
      T* out_row = out + row * out_row_stride;
      if (i + kVecWidth <= d) {
        // Full vector: one 16-byte load of each input, one store.
        const V g = load_vec<T, kVecWidth>(gate_row + i);
        const V u = load_vec<T, kVecWidth>(up_row + i);
        float y[kVecWidth];
#pragma unroll
        for (int e = 0; e < kVecWidth; ++e) y[e] = activate<kAct, kFastMath>(to_float(g.elt[e])) * to_float(u.elt[e]);
        store_rounded<T, kVecWidth>(out_row + i, y);
      } else {
        // Scalar tail: the last d % kVecWidth elements (kVecWidth > 1 only), so a
        // vector never reaches into the next row or past the buffer.
        for (int64_t j = i; j < d; ++j) {
          out_row[j] = from_float<T>(activate<kAct, kFastMath>(to_float(gate_row[j])) * to_float(up_row[j]));
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
