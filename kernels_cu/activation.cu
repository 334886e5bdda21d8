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
// are *_row_stride elements apart, so slices of wider buffers work. d and the strides
// are 32-bit (|value| < 2^31, checked in Python), the row offsets 64-bit.
// Mutates: `out` only. out may be gate or up exactly (each element is read and then
// written by the same thread); it must not partially overlap them (checked in Python).
//
// Template parameters:
//   T          float, __half, __nv_bfloat16
//   kAct       0 silu, 1 gelu (erf), 2 gelu (tanh approximation)
//   kVecWidth  1, 4 / sizeof(T) (16-bit T) and 8 / sizeof(T) (decode sizes,
//              bench/results/NOTES.md items 20, 22) or 16 / sizeof(T): elements per
//              memory access. More than 1 only when gate,
//              up and out pointers are 16-byte aligned and every row stride is a
//              multiple of kVecWidth; on the grid-stride walk the last d % kVecWidth
//              elements of a row go through a scalar tail.
//   kGridStride true: a 1-D grid of any size walks the (row, chunk) work items
//              grid-stride, so any number of rows fits (rows past the grid's y limit,
//              rows with a scalar tail, scalar rows past one wave); false: the grid is
//              (chunks_per_row, num_rows, 1), a block per work item (no integer
//              divisions or loop before the loads; the heuristics' choice wherever it
//              fits, at decode sizes and with 16-byte vectors at any size), and d must
//              be a multiple of kVecWidth (no scalar tail; plans.plan_activation ensures
//              it).
// Launch contract (planned by cupykern/plans.py::plan_activation): 1-D block of
// block_size threads (a multiple of 32, at most kActMaxBlockSize); the grid of
// kGridStride. A row is ceil(d / kVecWidth) slots (the last may be the scalar tail); a
// chunk is block_size consecutive slots, one per thread, chunks_per_row =
// ceil(slots / block_size). No shared memory.
//
// act_and_mul_sized_kernel<T, kAct, kVecWidth, kD>: silu_and_mul / gelu_and_mul at
// decode sizes with d compiled in (kD, an intermediate_size of cupykern.models'
// presets: cupykern/ops/activation.py::SIZED_D): x = [gate | up] rows 2 * kD apart, out
// rows kD apart (both contiguous), two pointer arguments; the launch contract of the
// block per work item above.
#include <cupykern/vec.cuh>
#include <cupykern/activations.cuh>
#include <cupykern/gated_rows.cuh>

using namespace cupykern;

// ---------------------------------------------------------------- act_and_mul
// The walk is cupykern/gated_rows.cuh's (shared with quant.cu); here y is rounded
// once to T.
template <typename T, int kAct, int kVecWidth, bool kGridStride>
__global__ void __launch_bounds__(kActMaxBlockSize) act_and_mul_kernel(
    T* out,                          // [num_rows, d], out_row_stride apart
    const T* gate,                   // [num_rows, d], gate_row_stride apart
    const T* up,                     // [num_rows, d], up_row_stride apart
    int d, int gate_row_stride, int up_row_stride, int out_row_stride,  // elements: |value| < 2^31, d < 2^31 - 16
    int64_t num_rows) {                                                 // last: only the grid-stride walk reads it
  act_and_mul_rows<T, kAct, kVecWidth, kGridStride>(StoreRoundedRows<T>{out, out_row_stride}, gate, up, num_rows,
                                                    d, gate_row_stride, up_row_stride);
}

// ---------------------------------------------------------------- act_and_mul_sized
// act_and_mul_kernel's block per work item with the sizes and strides as constants: the
// same slot, so the same bits. At 1-16 tokens 0.03-0.06 us a call less than the kernel
// with them as arguments (bench/results/NOTES.md, item 36: the constants, not the
// argument bytes; the same code with act_and_mul_kernel's 48 bytes of arguments took as
// long).
template <typename T, int kAct, int kVecWidth, int kD>
__global__ void __launch_bounds__(kActMaxBlockSize) act_and_mul_sized_kernel(
    T* out,                          // [num_rows, kD], contiguous
    const T* x) {                    // [num_rows, 2 * kD], contiguous: gate then up
  static_assert(kD > 0 && kD % kVecWidth == 0 && kD < (1 << 29), "kD: a multiple of kVecWidth below 2^29");
  act_and_mul_slot<T, kAct, kVecWidth, false>(StoreRoundedRows<T>{out, kD}, x, x + kD, static_cast<int>(blockIdx.y),
                                              blockIdx.x * blockDim.x + threadIdx.x, kD / kVecWidth, kD, 2 * kD,
                                              2 * kD);
}
