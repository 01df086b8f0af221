// Argument checks of compress_and_store (contract 11), shared by the CPU and the CUDA/HIP
// glue: compress_forward's checks of the pooling arguments and compress_norm_rope_store's of
// the store arguments, both naming compress_and_store, then what only the fused call has (one
// device for both halves, the pooled rows' width = the store format's, no shared memory between
// the cache and the other tensors).
#pragma once

#include <optional>
#include <string>

#include "compress/compress_checks.h"
#include "store/store_checks.h"

namespace dsv4 {

constexpr const char* kFusedOp = "compress_and_store";

struct FusedShape {
  compress::CallShape cs;
  StoreGeometry g;
};

// The pooled rows of a call: `out` when given, else a new [plan rows, head_dim] tensor of
// kv_score_input's dtype (what compress_forward's Python default makes). head_dim is checked
// first so that a bad one is named, not a failed allocation.
inline at::Tensor fused_rows(const at::Tensor& kv_score_input, const at::Tensor& plan,
                             const std::optional<at::Tensor>& out, int64_t head_dim) {
  if (out.has_value()) return *out;
  DSV4_CHECK(head_dim == 128 || head_dim == 512, kFusedOp, "head_dim",
             "must be 128 or 512, got ", head_dim);
  check_dim(plan, kFusedOp, "plan", 2);
  return at::empty({plan.size(0), head_dim}, kv_score_input.options());
}

inline FusedShape check_fused_args(const at::Tensor& kv_score_buffer,
                                   const at::Tensor& kv_score_input, const at::Tensor& ape,
                                   const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                                   const at::Tensor& norm_weight, const at::Tensor& freqs,
                                   const at::Tensor& out_loc, const at::Tensor& kvcache,
                                   const at::Tensor& rows, bool out_given, int64_t head_dim,
                                   int64_t compress_ratio, bool is_online, double eps,
                                   int64_t page_size, c10::string_view store_format,
                                   c10::string_view layout, const Dcp& dcp,
                                   at::DeviceType device_type) {
  const char* op = kFusedOp;
  DSV4_CHECK(kvcache.device() == kv_score_buffer.device(), op, "kvcache", "must be on ",
             kv_score_buffer.device(), " (kv_score_buffer's device), got ", kvcache.device());
  FusedShape f;
  f.cs = compress::check_compress_forward(kv_score_buffer, kv_score_input, ape, plan, plan_w,
                                          rows, head_dim, compress_ratio, is_online, op);
  const int format = parse_store_format(store_format, op);
  DSV4_CHECK(store_head_dim(format) == head_dim, op, "store_format",
             std::string(store_format.data(), store_format.size()), " stores rows of ",
             store_head_dim(format), " dims, but head_dim is ", head_dim);
  f.g = check_store_args(rows, plan, norm_weight, freqs, out_loc, kvcache, compress_ratio,
                         page_size, store_format, layout, dcp, device_type, op);
  check_store_eps(eps, op);
  // The op writes the cache while it reads (and writes) the others.
  check_no_overlap(kvcache, "kvcache", kv_score_buffer, "kv_score_buffer", op);
  check_no_overlap_rows(kvcache, "kvcache", kv_score_input, "kv_score_input", op);
  check_no_overlap(kvcache, "kvcache", ape, "ape", op);
  check_no_overlap(kvcache, "kvcache", norm_weight, "norm_weight", op);
  check_no_overlap(kvcache, "kvcache", freqs, "freqs", op);
  check_no_overlap(kvcache, "kvcache", out_loc, "out_loc", op);
  check_no_overlap(kvcache, "kvcache", plan, "plan", op);
  if (out_given) check_no_overlap(rows, "out", kvcache, "kvcache", op);
  return f;
}

}  // namespace dsv4
