// Argument checks of compress_partials and merge_partials (docs/contract.md 8), shared by the
// CPU and the CUDA/HIP glue, and the translation of the checked tensors into the torch-free
// kernel parameters (include/dsv4/cp_math.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>

#include "compress/compress_checks.h"
#include "include/dsv4/cp_math.h"
#include "op_checks.h"

namespace dsv4 {
namespace cp {

constexpr const char* kPartialsOp = "compress_partials";
constexpr const char* kMergeOp = "merge_partials";

inline PartialsParams check_compress_partials(const at::Tensor& kv_score_buffer,
                                              const at::Tensor& kv_score_input,
                                              const at::Tensor& input_rows,
                                              const at::Tensor& ape, const at::Tensor& plan_c,
                                              const at::Tensor& plan_w,
                                              const at::Tensor& partials,
                                              const at::Tensor& persist_rows, int64_t head_dim,
                                              int64_t compress_ratio, bool read_state) {
  const char* op = kPartialsOp;
  compress::check_pooling_inputs(op, kv_score_buffer, kv_score_input, ape, head_dim,
                                 compress_ratio, false);
  check_contiguous(kv_score_input, op, "kv_score_input");  // the partials kernels read packed rows
  const int cr = int(compress_ratio), hd = int(head_dim);
  check_dtype(input_rows, op, "input_rows", {at::kInt});
  check_dim(input_rows, op, "input_rows", 1);
  check_contiguous(input_rows, op, "input_rows");
  check_plan_tensor(plan_c, op, "plan_c", 16);
  check_plan_tensor(plan_w, op, "plan_w", 8);
  const int64_t windows = plan_c.size(0), persist = plan_w.size(0);

  check_dtype(partials, op, "partials", {at::kFloat});
  DSV4_CHECK(partials.dim() == 3 && partials.size(0) == 3 && partials.size(1) == windows &&
                 partials.size(2) == hd,
             op, "partials", "must be [3, ", windows, ", ", hd,
             "] (m | s | k of every plan_c window), got shape ", partials.sizes());
  check_contiguous(partials, op, "partials");
  const int64_t in_row = compress::input_row_elems(cr, hd);
  DSV4_CHECK(persist_rows.scalar_type() == kv_score_input.scalar_type(), op, "persist_rows",
             "must have kv_score_input's dtype ", kv_score_input.scalar_type(), ", got ",
             persist_rows.scalar_type());
  DSV4_CHECK(persist_rows.dim() == 2 && persist_rows.size(0) == persist &&
                 persist_rows.size(1) == in_row,
             op, "persist_rows", "must be [", persist, ", ", in_row,
             "] (one kv_score row per plan_w record), got shape ", persist_rows.sizes());
  check_contiguous(persist_rows, op, "persist_rows");

  const at::Device dev = kv_score_buffer.device();
  check_device(kv_score_input, dev, op, "kv_score_input");
  check_device(input_rows, dev, op, "input_rows");
  check_device(ape, dev, op, "ape");
  check_device(plan_c, dev, op, "plan_c");
  check_device(plan_w, dev, op, "plan_w");
  check_device(partials, dev, op, "partials");
  check_device(persist_rows, dev, op, "persist_rows");
  check_no_grad(kv_score_buffer, op, "kv_score_buffer");
  check_no_grad(kv_score_input, op, "kv_score_input");
  check_no_grad(ape, op, "ape");
  check_no_grad(partials, op, "partials");
  check_no_grad(persist_rows, op, "persist_rows");
  // The op writes partials and persist_rows while it reads the others.
  const std::pair<const at::Tensor*, const char*> inputs[] = {
      {&kv_score_buffer, "kv_score_buffer"}, {&kv_score_input, "kv_score_input"},
      {&input_rows, "input_rows"}, {&ape, "ape"}, {&plan_c, "plan_c"}, {&plan_w, "plan_w"}};
  for (const auto& in : inputs) {
    check_no_overlap(partials, "partials", *in.first, in.second, op);
    check_no_overlap(persist_rows, "persist_rows", *in.first, in.second, op);
  }
  check_no_overlap(partials, "partials", persist_rows, "persist_rows", op);

  PartialsParams p{};
  p.state = kv_score_buffer.data_ptr();
  p.input = kv_score_input.data_ptr();
  p.input_rows = input_rows.data_ptr<int32_t>();
  p.ape = ape.data_ptr();
  p.plan_c = plan_c.data_ptr<uint8_t>();
  p.plan_w = plan_w.data_ptr<uint8_t>();
  p.partials = partials.data_ptr<float>();
  p.persist = persist_rows.data_ptr();
  p.num_state_rows = kv_score_buffer.numel() / compress::state_row_elems(cr, hd, false);
  p.num_local_rows = kv_score_input.size(0);
  p.num_batch_rows = input_rows.size(0);
  p.num_windows = windows;
  p.num_persist = persist;
  p.hd = hd;
  p.cr = cr;
  p.ape_type = compress::ape_type_of(ape);
  p.read_state = read_state ? 1 : 0;
  return p;
}

inline MergeParams check_merge_partials(const at::Tensor& partials,
                                        const std::optional<at::Tensor>& max_m,
                                        const at::Tensor& out) {
  const char* op = kMergeOp;
  check_dtype(partials, op, "partials", {at::kFloat});
  DSV4_CHECK(partials.dim() == 4 && partials.size(0) >= 1 && partials.size(1) == 3, op,
             "partials", "must be [ranks, 3, num_windows, head_dim] (m | s | k of each rank), got "
             "shape ", partials.sizes());
  check_contiguous(partials, op, "partials");
  DSV4_CHECK(partials.size(0) <= 0x7fffffff, op, "partials", "has too many ranks (",
             partials.size(0), ")");
  const int64_t windows = partials.size(2), hd = partials.size(3);
  const at::Device dev = partials.device();
  if (max_m.has_value()) {
    check_dtype(*max_m, op, "max_m", {at::kFloat});
    DSV4_CHECK(max_m->dim() == 2 && max_m->size(0) == windows && max_m->size(1) == hd, op,
               "max_m", "must be [", windows, ", ", hd, "], got shape ", max_m->sizes());
    check_contiguous(*max_m, op, "max_m");
    check_device(*max_m, dev, op, "max_m");
    check_no_grad(*max_m, op, "max_m");
  }
  const bool out_partial = out.dim() == 3;
  if (out_partial) {
    check_dtype(out, op, "out", {at::kFloat});
    DSV4_CHECK(out.size(0) == 3 && out.size(1) == windows && out.size(2) == hd, op, "out",
               "(a merged partial) must be [3, ", windows, ", ", hd, "], got shape ",
               out.sizes());
  } else {
    check_dtype(out, op, "out", {at::kFloat, at::kBFloat16});
    DSV4_CHECK(out.dim() == 2 && out.size(0) == windows && out.size(1) == hd, op, "out",
               "must be [", windows, ", ", hd, "] (compressed rows) or [3, ", windows, ", ", hd,
               "] (a merged partial), got shape ", out.sizes());
  }
  check_contiguous(out, op, "out");
  check_device(out, dev, op, "out");
  check_no_grad(partials, op, "partials");
  check_no_grad(out, op, "out");
  check_no_overlap(out, "out", partials, "partials", op);
  if (max_m.has_value()) check_no_overlap(out, "out", *max_m, "max_m", op);

  MergeParams p{};
  p.partials = partials.data_ptr<float>();
  p.max_m = max_m.has_value() ? max_m->data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.num_elems = windows * hd;
  p.ranks = int32_t(partials.size(0));
  p.out_partial = out_partial ? 1 : 0;
  p.out_type = out.scalar_type() == at::kFloat ? compress::kOutF32 : compress::kOutBF16;
  return p;
}

}  // namespace cp
}  // namespace dsv4
