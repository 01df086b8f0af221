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

// compress_forward's launches in two parts, for compress_and_store: the pooling (every launch
// but the offline prefill's plan_w row writes) and those row writes (after the pooling).
void launch_compress_pooling(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env);
void launch_compress_row_writes(const CallShape& cs, const at::Tensor& kv_score_buffer,
                                const at::Tensor& kv_score_input, const at::Tensor& ape,
                                const at::Tensor& plan, const at::Tensor& plan_w,
                                const at::Tensor& out, const LaunchEnv& env);

void launch_compress_forward(const CallShape& cs, const at::Tensor& kv_score_buffer,
                             const at::Tensor& kv_score_input, const at::Tensor& ape,
                             const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& out, const LaunchEnv& env);

}  // namespace compress
}  // namespace dsv4
