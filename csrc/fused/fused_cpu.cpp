// compress_and_store on the CPU (contract 11): compress_forward's CPU kernel into the pooled
// rows (`out`, or a scratch of kv_score_input's dtype), then compress_norm_rope_store's CPU
// kernel on them. The same code as the unfused pair, so the same bytes by construction.
#include <torch/library.h>

#include "compress/compress_cpu.h"
#include "fused/fused_checks.h"
#include "store/store_cpu.h"

namespace dsv4 {
namespace {

void compress_and_store_cpu(at::Tensor kv_score_buffer, const at::Tensor& kv_score_input,
                            const at::Tensor& ape, const at::Tensor& plan,
                            const std::optional<at::Tensor>& plan_w,
                            const at::Tensor& norm_weight, const at::Tensor& freqs,
                            const at::Tensor& out_loc, at::Tensor kvcache,
                            const std::optional<at::Tensor>& out, int64_t head_dim,
                            int64_t compress_ratio, bool is_online, double eps,
                            int64_t page_size, c10::string_view store_format,
                            c10::string_view layout, int64_t dcp_world_size, int64_t dcp_rank,
                            int64_t dcp_interleave) {
  at::Tensor rows = fused_rows(kv_score_input, plan, out, head_dim);
  check_fused_args(kv_score_buffer, kv_score_input, ape, plan, plan_w, norm_weight, freqs,
                   out_loc, kvcache, rows, out.has_value(), head_dim, compress_ratio, is_online,
                   eps, page_size, store_format, layout,
                   {dcp_world_size, dcp_rank, dcp_interleave}, at::kCPU);
  compress::compress_forward_cpu(kv_score_buffer, kv_score_input, ape, plan, plan_w, rows,
                                 head_dim, compress_ratio, is_online);
  compress_norm_rope_store_cpu(rows, plan, norm_weight, freqs, out_loc, kvcache,
                               !plan_w.has_value(), compress_ratio, eps, page_size, store_format,
                               layout, dcp_world_size, dcp_rank, dcp_interleave);
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("compress_and_store", &dsv4::compress_and_store_cpu);
}
