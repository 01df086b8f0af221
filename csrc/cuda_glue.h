// Torch-side helpers for the CUDA/HIP glue of every op family: device guard, current
// stream, whether PDL may be used on the tensors' device, launch error check.
#pragma once

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

inline gpuStream_t current_stream(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

}  // namespace dsv4

#define DSV4_CHECK_LAUNCH() C10_CUDA_KERNEL_LAUNCH_CHECK()
