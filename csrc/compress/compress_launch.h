// The launches of compress_forward's CUDA/HIP kernels on checked arguments (compress_cuda.cu),
// also made by compress_and_store's CUDA glue (fused/fused_cuda.cu). The caller has made the
// checks (check_compress_forward, check_gpu_alignment) and holds the device guard.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "compress/compress_checks.h"
#include "cuda_glue.h"

namespace dsv4 {
namespace compress {

void launch_compress_forward(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env);

}  // namespace compress
}  // namespace dsv4
