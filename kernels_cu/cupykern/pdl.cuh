// pdl.cuh: programmatic dependent launch (PDL, sm_90+), the device side.
//
// A kernel launched with the programmatic-stream-serialization attribute
// (cupykern/dependent_launch.py) may start while the kernel before it in the stream is
// still running, once every block of that kernel has called allow_dependent_grids() (or
// exited). Its blocks then do what depends on no earlier kernel (request weights) and
// call wait_prior_grids(), which returns when every earlier kernel of the stream has
// finished and its writes are visible. So a kernel written for it:
//   * reads only data no kernel writes (weights, constant tables) before the wait;
//   * writes nothing before the wait (an earlier kernel may still read it);
//   * waits in every block, before any early return (its completion then implies its
//     predecessors', which the kernels after it rely on).
// Launched the ordinary way both calls do nothing, as on GPUs before sm_90.
//
// Source: CUDA C++ Programming Guide, "Programmatic Dependent Launch and
// Synchronization"; PTX ISA, griddepcontrol.
#pragma once

namespace cupykern {

// Lets the next kernel of the stream start its blocks (their prologues run beside ours).
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the kernels before this one in the stream have finished (see above).
__device__ __forceinline__ void wait_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Both, at the point where a kernel's independent prologue ends.
__device__ __forceinline__ void start_dependent_part() {
  allow_dependent_grids();
  wait_prior_grids();
}

}  // namespace cupykern
