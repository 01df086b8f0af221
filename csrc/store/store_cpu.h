// compress_norm_rope_store's CPU kernel (store_cpu.cpp), also run by compress_and_store's CPU
// kernel (fused/fused_cpu.cpp) so that the fused op stores with the same code.
#pragma once

#include <ATen/ATen.h>

namespace dsv4 {

void compress_norm_rope_store_cpu(const at::Tensor& kv, const at::Tensor& plan,
                                  const at::Tensor& norm_weight, const at::Tensor& freqs,
                                  const at::Tensor& out_loc, at::Tensor& kvcache, bool is_decode,
                                  int64_t compress_ratio, double eps, int64_t page_size,
                                  c10::string_view store_format, c10::string_view layout,
                                  int64_t dcp_world_size, int64_t dcp_rank,
                                  int64_t dcp_interleave);

}  // namespace dsv4
