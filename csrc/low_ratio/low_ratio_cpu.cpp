// The V4.1 ratio-1 / ratio-2 ops, CPU backend (contract V4.1 1 - 3).
#include <torch/library.h>

#include "low_ratio/low_ratio_checks.h"

namespace dsv4 {
namespace {

void c1_norm_rope_store_cpu(const at::Tensor& kv, const at::Tensor& norm_weight, double eps,
                            const at::Tensor& freqs, const at::Tensor& positions,
                            const at::Tensor& out_loc, at::Tensor& kvcache, int64_t page_size,
                            c10::string_view layout, at::Tensor& latent) {
  check_c1_args(kv, norm_weight, eps, freqs, positions, out_loc, kvcache, page_size, layout,
                latent, at::kCPU);
  DSV4_CHECK(false, kC1Op, "kv", "has no CPU kernel in this build");
}

void c2_norm_rope_store_cpu(const at::Tensor& kv_score, at::Tensor& state,
                            const at::Tensor& norm_weight, double eps, const at::Tensor& freqs,
                            const at::Tensor& positions, const at::Tensor& req,
                            const at::Tensor& raw_out_loc, at::Tensor& kvcache,
                            int64_t page_size, int64_t ring_size, int64_t draft_len,
                            c10::string_view layout, at::Tensor& latent) {
  check_c2_args(kC2Op, kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc,
                kvcache, page_size, ring_size, draft_len, layout, latent, at::kCPU);
  DSV4_CHECK(false, kC2Op, "kv_score", "has no CPU kernel in this build");
}

void c2_prefill_norm_rope_store_cpu(const at::Tensor& kv_score, at::Tensor& state,
                                    const at::Tensor& norm_weight, double eps,
                                    const at::Tensor& freqs, const at::Tensor& positions,
                                    const at::Tensor& req, const at::Tensor& raw_out_loc,
                                    const at::Tensor& extend_start_loc,
                                    const at::Tensor& extend_seq_lens, at::Tensor& kvcache,
                                    int64_t page_size, int64_t ring_size,
                                    c10::string_view layout, at::Tensor& latent) {
  check_c2_prefill_args(kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc,
                        extend_start_loc, extend_seq_lens, kvcache, page_size, ring_size, layout,
                        latent, at::kCPU);
  DSV4_CHECK(false, kC2PrefillOp, "kv_score", "has no CPU kernel in this build");
}

void low_ratio_index_k_store_cpu(const at::Tensor& k, const at::Tensor& norm_weight, double eps,
                                 const at::Tensor& freqs, const at::Tensor& positions,
                                 const at::Tensor& loc, at::Tensor& cache, int64_t page_size,
                                 int64_t ratio) {
  check_index_k_args(k, norm_weight, eps, freqs, positions, loc, cache, page_size, ratio,
                     at::kCPU);
  DSV4_CHECK(false, kIndexKOp, "k", "has no CPU kernel in this build");
}

void kv_store_cpu(const at::Tensor& x, const at::Tensor& loc,
                  const std::optional<at::Tensor>& freqs_rows, at::Tensor& kvcache,
                  int64_t page_size, c10::string_view layout) {
  check_kv_store_args(x, loc, freqs_rows, kvcache, page_size, layout, at::kCPU);
  DSV4_CHECK(false, kKvStoreOp, "x", "has no CPU kernel in this build");
}

}  // namespace
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("c1_norm_rope_store", &dsv4::c1_norm_rope_store_cpu);
  m.impl("c2_norm_rope_store", &dsv4::c2_norm_rope_store_cpu);
  m.impl("c2_prefill_norm_rope_store", &dsv4::c2_prefill_norm_rope_store_cpu);
  m.impl("low_ratio_index_k_store", &dsv4::low_ratio_index_k_store_cpu);
  m.impl("kv_store", &dsv4::kv_store_cpu);
}
