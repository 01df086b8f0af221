// Torch-side helpers for the CUDA/HIP glue of every op family: device guard, current
// stream, whether PDL may be used on the tensors' device, launch error check.
#pragma once

#include <algorithm>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "include/dsv4/launch.cuh"

namespace dsv4 {

// PDL exists from sm_90 on; never on HIP. DSV4_OPS_NO_PDL=1 turns it off (for A/B timing).
inline bool pdl_enabled(const at::Tensor& t) {
#if defined(USE_ROCM)
  (void)t;
  return false;
#else
  static const bool disabled = [] {
    const char* e = std::getenv("DSV4_OPS_NO_PDL");
    return e != nullptr && e[0] == '1';
  }();
  if (disabled) return false;
  return at::cuda::getDeviceProperties(t.get_device())->major >= 9;
#endif
}

// DSV4_OPS_TEST_STALE_PLAN=1 makes every plan guess of the store kernel wrong (load_early in
// portability.h), so that the tests run the path that reloads from the plan read after the
// wait, and the sanitizer sees that the loads of garbage guesses stay inside the buffers.
inline uint32_t plan_guess_xor() {
  static const uint32_t x = [] {
    const char* e = std::getenv("DSV4_OPS_TEST_STALE_PLAN");
    return (e != nullptr && e[0] == '1') ? 0x9e3779b9u : 0u;
  }();
  return x;
}

// Streaming multiprocessors (CUDA) / compute units (HIP) of the tensor's device, at least 1.
inline int64_t sm_count(const at::Tensor& t) {
  return std::max(1, at::cuda::getDeviceProperties(t.get_device())->multiProcessorCount);
}

inline gpuStream_t current_stream(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

}  // namespace dsv4

#define DSV4_CHECK_LAUNCH() C10_CUDA_KERNEL_LAUNCH_CHECK()
