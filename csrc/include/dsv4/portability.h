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

// v of lane `src` of the calling thread's 32-lane group.
template <typename T>
DSV4_DEVICE T shfl_idx(T v, int src) {
#if defined(DSV4_HIP)
  return __shfl(v, src, kLaneGroup);
#else
  return __shfl_sync(0xffffffffu, v, src, kLaneGroup);
#endif
}

// Bit i: `pred` of lane i of the calling thread's 32-lane group (every lane of the group calls).
DSV4_DEVICE uint32_t group_ballot(bool pred) {
#if defined(DSV4_HIP)
  const unsigned long long b = __ballot(pred);
  return kWarpSize == 64 ? uint32_t(b >> (threadIdx.x & 32)) : uint32_t(b);
#else
  return __ballot_sync(0xffffffffu, pred);
#endif
}

template <typename T>
DSV4_DEVICE T group_sum(T v) {
#pragma unroll
  for (int m = kLaneGroup / 2; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}

// Programmatic dependent launch (sm_90+). A kernel launched with PDL may start while the
// previous kernel of the stream still runs; pdl_wait() blocks until that kernel has finished
// and its writes are visible. pdl_trigger() lets the next kernel start; a dsv4 kernel calls it
// only after its own wait (write_rows_kernel relies on that of the pooling kernel before it).
// Compiled out on HIP and on older CUDA targets, where launches are plainly serialised.
#if !defined(DSV4_HIP) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define DSV4_GRID_DEPENDENCY 1
#endif

DSV4_DEVICE void pdl_wait() {
#if defined(DSV4_GRID_DEPENDENCY)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

DSV4_DEVICE void pdl_trigger() {
#if defined(DSV4_GRID_DEPENDENCY)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A load the compiler issues where it is written (a volatile access): not sunk into the
// branch that needs it, so that independent loads written together go out together. (A
// volatile asm load, __ldcg, was still sunk below a branch by nvcc 13.)
DSV4_DEVICE int64_t load_now(const int64_t* p) {
  return *reinterpret_cast<const volatile int64_t*>(p);
}

// Compiler-only barrier: no memory access moves across it (the streaming loads are volatile
// asm statements without a memory clobber, which an ordinary store may otherwise pass).
DSV4_DEVICE void compiler_fence() { asm volatile("" ::: "memory"); }

// A plan word guessed before pdl_wait(). When a kernel's first loads depend on its plan,
// waiting and only then reading the plan costs two memory round trips before the real work.
// The store kernel instead reads its record before the wait (load_early), issues its loads
// from that guess right after the wait together with the record read after the wait
// (load_after_wait), and loads again in the rare case that the two differ (the plan was still
// being written by the kernel before). Any guess only addresses memory inside the buffers
// (the same bounds checks as for the real record), and nothing is written from it. The early
// read goes to L2 only (ld.global.cg), so it leaves no stale line in L1 for the later read to
// hit. Without PDL the early read already is the real one. (Measured on the H200: worth it
// for the store kernel, one round trip in a small decode step; a loss for the pooling
// kernels, whose registers it strains.)
DSV4_DEVICE uint2 load_early(const uint2* p) {
#if defined(DSV4_GRID_DEPENDENCY)
  return __ldcg(p);
#else
  return *p;
#endif
}

DSV4_DEVICE uint2 load_after_wait(const uint2* p, uint2 early) {
#if defined(DSV4_GRID_DEPENDENCY)
  (void)early;
  return *p;
#else
  return early;
#endif
}

#endif  // DSV4_GPU_COMPILER

}  // namespace dsv4
