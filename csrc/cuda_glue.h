// Torch-side helpers for the CUDA/HIP glue of every op family: where kernels launch (stream,
// PDL, multiprocessors), launch error check.
#pragma once

#include <algorithm>
#include <cstdlib>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "include/dsv4/launch.cuh"

namespace dsv4 {

// Where and how an op's kernels launch, for the device of tensor t (which the op's device guard
// has made current), from one device-properties lookup:
//   stream  the current stream of that device;
//   pdl     programmatic dependent launch: sm_90 and later, never on HIP; DSV4_OPS_NO_PDL=1
//           turns it off (for A/B timing);
//   sms     streaming multiprocessors (CUDA) / compute units (HIP), at least 1;
//   sm_threads  the threads one of them holds at once, at least 1.
struct LaunchEnv {
  gpuStream_t stream;
  bool pdl;
  int64_t sms;
  int64_t sm_threads;
};

inline LaunchEnv launch_env(const at::Tensor& t) {
  static const bool pdl_disabled = [] {
    const char* e = std::getenv("DSV4_OPS_NO_PDL");
    return e != nullptr && e[0] == '1';
  }();
  const auto* prop = at::cuda::getDeviceProperties(t.get_device());
  LaunchEnv env;
  env.stream = at::cuda::getCurrentCUDAStream(t.get_device()).stream();
#if defined(USE_ROCM)
  (void)pdl_disabled;
  env.pdl = false;
#else
  env.pdl = !pdl_disabled && prop->major >= 9;
#endif
  env.sms = std::max(1, prop->multiProcessorCount);
  env.sm_threads = std::max(1, prop->maxThreadsPerMultiProcessor);
  return env;
}

// Whether p is n-byte aligned (the kernels' vector-access flags).
inline bool aligned(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

}  // namespace dsv4

#define DSV4_CHECK_LAUNCH() C10_CUDA_KERNEL_LAUNCH_CHECK()
