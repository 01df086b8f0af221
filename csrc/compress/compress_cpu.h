// compress_forward's CPU kernel (compress_cpu.cpp), also run by compress_and_store's CPU
// kernel (fused/fused_cpu.cpp) so that the fused op pools with the same code.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace dsv4 {
namespace compress {

void compress_forward_cpu(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                          const at::Tensor& ape, const at::Tensor& plan,
                          const std::optional<at::Tensor>& plan_w, at::Tensor out,
                          int64_t head_dim, int64_t compress_ratio, bool is_online);

}  // namespace compress
}  // namespace dsv4
