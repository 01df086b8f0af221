// compress_and_store on CUDA / HIP (contract 11): the checks of both halves (fused_checks.h),
// then compress_forward's launches into the pooled rows (`out`, or a scratch of
// kv_score_input's dtype from the caching allocator) and compress_norm_rope_store's launch on
// them, on the current stream, the store a programmatic dependent launch of the pooling kernel.
// The pair's kernels on the pair's arguments: the pair's bytes. No host sync, no host
// allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "compress/compress_launch.h"
#include "cuda_glue.h"
#include "fused/fused_checks.h"
#include "store/store_launch.h"

namespace dsv4 {
namespace {

void compress_and_store_cuda(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                             const at::Tensor& ape, const at::Tensor& plan,
                             const std::optional<at::Tensor>& plan_w,
                             const at::Tensor& norm_weight, const at::Tensor& freqs,
                             const at::Tensor& out_loc, at::Tensor kvcache,
                             const std::optional<at::Tensor>& out, int64_t head_dim,
                             int64_t compress_ratio, bool is_online, double eps,
                             int64_t page_size, c10::string_view store_format,
                             c10::string_view layout, int64_t dcp_world_size, int64_t dcp_rank,
                             int64_t dcp_interleave) {
  DSV4_CHECK(kv_score_buffer.is_cuda(), kFusedOp, "kv_score_buffer",
             "must be a CUDA tensor for the CUDA kernel, got ", kv_score_buffer.device());
  const c10::cuda::OptionalCUDAGuard guard(kv_score_buffer.device());
  const at::Tensor rows = fused_rows(kv_score_input, plan, out, head_dim);
  const FusedShape f = check_fused_args(
      kv_score_buffer, kv_score_input, ape, plan, plan_w, norm_weight, freqs, out_loc, kvcache,
      rows, out.has_value(), head_dim, compress_ratio, is_online, eps, page_size, store_format,
      layout, {dcp_world_size, dcp_rank, dcp_interleave}, at::kCUDA);
  compress::check_gpu_alignment(kv_score_buffer, kv_score_input, ape, plan, plan_w, rows,
                                kFusedOp);
  const LaunchEnv env = launch_env(kv_score_buffer);
  compress::launch_compress_forward(f.cs, kv_score_buffer, kv_score_input, ape, plan, plan_w,
                                    rows, env);
  launch_compress_norm_rope_store(f.g, rows, plan, norm_weight, freqs, out_loc, kvcache,
                                  !plan_w.has_value(), compress_ratio, eps, env);
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("compress_and_store", &dsv4::compress_and_store_cuda);
}
