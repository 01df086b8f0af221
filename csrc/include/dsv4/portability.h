// Portability layer shared by the CPU, CUDA and HIP builds.
//
// Everything under csrc/include/dsv4/ is header-only and free of torch includes, so that
// g++ (CPU kernels), nvcc (CUDA) and hipcc (ROCm) compile the very same math. Backend
// differences (qualifiers, shuffles, programmatic dependent launch) live here and only here.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DSV4_GPU_COMPILER 1
#define DSV4_HD __host__ __device__ __forceinline__
#define DSV4_DEVICE __device__ __forceinline__
#else
#define DSV4_HD inline
#define DSV4_DEVICE inline
#endif

#if defined(__HIPCC__) || defined(USE_ROCM)
#define DSV4_HIP 1
#endif

#if defined(DSV4_GPU_COMPILER)
#if defined(DSV4_HIP)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif
#endif

namespace dsv4 {

// Threads that cooperate on one token in the GPU kernels. 32 on every target: on a 64-lane
// AMD wavefront a "lane group" is half a wavefront and every shuffle below passes width 32,
// so reductions never mix the two halves.
constexpr int kLaneGroup = 32;

#if defined(DSV4_GPU_COMPILER)

// Hardware warp / wavefront width as a compile-time property of the device target.
#if defined(DSV4_HIP) && defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#elif defined(DSV4_HIP) && defined(__HIP_DEVICE_COMPILE__)
constexpr int kWarpSize = 64;  // gfx9 CDNA parts (gfx90a, gfx942, gfx950) are wave64
#else
constexpr int kWarpSize = 32;
#endif
static_assert(kWarpSize % kLaneGroup == 0, "lane groups must tile a warp");

// XOR shuffle within a 32-lane group (see kLaneGroup).
template <typename T>
DSV4_DEVICE T shfl_xor(T v, int mask) {
#if defined(DSV4_HIP)
  return __shfl_xor(v, mask, kLaneGroup);
#else
  return __shfl_xor_sync(0xffffffffu, v, mask, kLaneGroup);
#endif
}

template <typename T>
DSV4_DEVICE T group_sum(T v) {
#pragma unroll
  for (int m = kLaneGroup / 2; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

// Programmatic dependent launch (sm_90+). The wait blocks until the previous kernel in the
// stream has finished (or triggered); the trigger lets the next kernel start its prologue.
// Compiled out on HIP and on older CUDA targets, where launches are plainly serialised.
DSV4_DEVICE void pdl_wait() {
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

DSV4_DEVICE void pdl_trigger() {
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#endif  // DSV4_GPU_COMPILER

}  // namespace dsv4
