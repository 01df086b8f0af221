// The launch of compress_norm_rope_store's CUDA/HIP kernel on checked arguments, and its kernel
// arguments (store_cuda.cu), also used by compress_and_store's CUDA glue (fused/fused_cuda.cu).
// The caller has made the checks (check_store_args, check_store_eps) and holds the device guard.
#pragma once

#include <ATen/ATen.h>

#include "cuda_glue.h"
#include "include/dsv4/store/store_kernel.cuh"
#include "store/store_checks.h"

namespace dsv4 {

// The store kernel format of checked arguments: the V4.0 format, or for a V4.1 layout (whose
// format is fp8_ds_mla, checked) its rows in the layout's encoding.
inline int store_kernel_format(const StoreGeometry& g) {
  return g.layout == kLayoutV4 ? g.format : store_layout_format(g.layout);
}

StoreKernelArgs store_kernel_args(const StoreGeometry& g, const at::Tensor& kv,
                                  const at::Tensor& plan, const at::Tensor& norm_weight,
                                  const at::Tensor& freqs, const at::Tensor& out_loc,
                                  const at::Tensor& kvcache, bool is_decode,
                                  int64_t compress_ratio, double eps);

void launch_compress_norm_rope_store(const StoreGeometry& g, const at::Tensor& kv,
                                     const at::Tensor& plan, const at::Tensor& norm_weight,
                                     const at::Tensor& freqs, const at::Tensor& out_loc,
                                     const at::Tensor& kvcache, bool is_decode,
                                     int64_t compress_ratio, double eps, const LaunchEnv& env);

}  // namespace dsv4
