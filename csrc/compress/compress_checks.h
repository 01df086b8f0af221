// Argument checks of compress_forward, shared by the CPU and the CUDA/HIP glue, and the
// translation of the checked tensors into the torch-free kernel parameters.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "include/dsv4/compress_math.h"
#include "op_checks.h"

namespace dsv4 {
namespace compress {

constexpr const char* kOp = "compress_forward";

// Which kernels a (checked) call runs.
struct CallShape {
  bool decode;  // plan_w is None
  bool online;
  int cr;
  int hd;
};

// The pooling inputs of every op that folds windows (compress_forward, compress_partials):
// head_dim, compress_ratio, the state buffer, the kv_score rows and ape, named as `op`.
inline void check_pooling_inputs(const char* op, const at::Tensor& kv_score_buffer,
                                 const at::Tensor& kv_score_input, const at::Tensor& ape,
                                 int64_t head_dim, int64_t compress_ratio, bool is_online) {
  DSV4_CHECK(head_dim == 128 || head_dim == 512, op, "head_dim", "must be 128 or 512, got ",
             head_dim);
  check_ratio(compress_ratio, op);
  const int cr = int(compress_ratio), hd = int(head_dim);

  // State buffer: rows of the layout's width, any leading shape, contiguous.
  const int64_t st_row = state_row_elems(cr, hd, is_online);
  check_dtype(kv_score_buffer, op, "kv_score_buffer", {at::kFloat, at::kBFloat16});
  DSV4_CHECK(kv_score_buffer.dim() >= 2 && kv_score_buffer.size(-1) == st_row, op,
             "kv_score_buffer",
             "must be [num_pages, page_rows, ", st_row, "] (last dim ",
             is_online ? "3*head_dim for the online state"
                       : (cr == 4 ? "4*head_dim" : "2*head_dim"),
             "), got shape ", kv_score_buffer.sizes());
  check_contiguous(kv_score_buffer, op, "kv_score_buffer");

  const int64_t in_row = input_row_elems(cr, hd);
  check_dtype(kv_score_input, op, "kv_score_input", {at::kFloat, at::kBFloat16});
  check_dim(kv_score_input, op, "kv_score_input", 2);
  DSV4_CHECK(kv_score_input.size(1) == in_row, op, "kv_score_input", "must have ", in_row,
             " columns (", cr == 4 ? "4" : "2", "*head_dim), got shape ", kv_score_input.sizes());
  check_strided_rows(kv_score_input, op, "kv_score_input");

  const int win = window_of(cr);
  check_dtype(ape, op, "ape", {at::kFloat, at::kBFloat16, at::kHalf});
  check_dim(ape, op, "ape", 2);
  DSV4_CHECK(ape.size(0) == win && ape.size(1) == hd, op, "ape", "must be [", win, ", ", hd,
             "], got shape ", ape.sizes());
  check_contiguous(ape, op, "ape");
}

// `op` names the op in the errors (compress_and_store checks its pooling arguments here too).
inline CallShape check_compress_forward(const at::Tensor& kv_score_buffer,
                                        const at::Tensor& kv_score_input, const at::Tensor& ape,
                                        const at::Tensor& plan,
                                        const std::optional<at::Tensor>& plan_w,
                                        const at::Tensor& out, int64_t head_dim,
                                        int64_t compress_ratio, bool is_online,
                                        const char* op = kOp) {
  check_ratio(compress_ratio, op);  // before is_online, which names the ratio
  DSV4_CHECK(!is_online || compress_ratio == 128, op, "is_online",
             "needs compress_ratio 128 (the online running state is cr = 128 only), got ",
             compress_ratio);
  check_pooling_inputs(op, kv_score_buffer, kv_score_input, ape, head_dim, compress_ratio,
                       is_online);
  const int cr = int(compress_ratio), hd = int(head_dim);
  const bool decode = !plan_w.has_value();

  check_plan_tensor(plan, op, "plan", 16);
  if (plan_w.has_value()) check_plan_tensor(*plan_w, op, "plan_w", is_online ? 16 : 8);
  if (decode) {
    DSV4_CHECK(kv_score_input.size(0) == plan.size(0), op, "kv_score_input",
               "must have one row per decode plan row (", plan.size(0), "), got ",
               kv_score_input.size(0));
  }

  check_dtype(out, op, "out", {at::kFloat, at::kBFloat16});
  check_dim(out, op, "out", 2);
  DSV4_CHECK(out.size(0) == plan.size(0) && out.size(1) == hd, op, "out", "must be [",
             plan.size(0), ", ", hd, "] (plan rows x head_dim), got shape ", out.sizes());
  check_contiguous(out, op, "out");

  const at::Device dev = kv_score_buffer.device();
  check_device(kv_score_input, dev, op, "kv_score_input");
  check_device(ape, dev, op, "ape");
  check_device(plan, dev, op, "plan");
  if (plan_w.has_value()) check_device(*plan_w, dev, op, "plan_w");
  check_device(out, dev, op, "out");

  check_no_grad(kv_score_buffer, op, "kv_score_buffer");
  check_no_grad(kv_score_input, op, "kv_score_input");
  check_no_grad(ape, op, "ape");
  check_no_grad(out, op, "out");
  // The op writes out and the state buffer while it reads the others.
  check_no_overlap(out, "out", kv_score_buffer, "kv_score_buffer", op);
  check_no_overlap_rows(out, "out", kv_score_input, "kv_score_input", op);
  check_no_overlap(out, "out", ape, "ape", op);
  check_no_overlap_rows(kv_score_buffer, "kv_score_buffer", kv_score_input, "kv_score_input",
                        op);
  check_no_overlap(kv_score_buffer, "kv_score_buffer", ape, "ape", op);
  return CallShape{decode, is_online, cr, hd};
}

// GPU kernels use 16-byte (fp32) / 8-byte (bf16, fp16) vector accesses (kVec elements), also
// at every kv_score_input row.
inline void check_vector_aligned(const at::Tensor& t, const char* arg, const char* op = kOp) {
  const int64_t bytes = 4 * t.element_size();
  DSV4_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % uintptr_t(bytes) == 0, op, arg,
             "must start on a ", bytes, "-byte boundary (got a view at an unaligned offset)");
}

inline void check_gpu_alignment(const at::Tensor& kv_score_buffer,
                                const at::Tensor& kv_score_input, const at::Tensor& ape,
                                const at::Tensor& plan, const std::optional<at::Tensor>& plan_w,
                                const at::Tensor& out, const char* op = kOp) {
  check_vector_aligned(kv_score_buffer, "kv_score_buffer", op);
  check_vector_aligned(kv_score_input, "kv_score_input", op);
  DSV4_CHECK(row_stride_of(kv_score_input) % kVec == 0, op, "kv_score_input",
             "must have a row stride that is a multiple of ", kVec,
             " elements on the GPU (every row must start on the vector boundary), got strides ",
             kv_score_input.strides());
  check_vector_aligned(ape, "ape", op);
  check_vector_aligned(out, "out", op);
  DSV4_CHECK(reinterpret_cast<uintptr_t>(plan.data_ptr()) % 16 == 0, op, "plan",
             "must start on a 16-byte boundary");
  if (plan_w.has_value()) {
    DSV4_CHECK(reinterpret_cast<uintptr_t>(plan_w->data_ptr()) % uintptr_t(plan_w->size(1)) == 0,
               op, "plan_w", "must start on a ", plan_w->size(1), "-byte boundary");
  }
}

inline int32_t ape_type_of(const at::Tensor& ape) {
  const at::ScalarType t = ape.scalar_type();
  return t == at::kFloat ? kApeF32 : (t == at::kBFloat16 ? kApeBF16 : kApeF16);
}

// Parameters common to every pass of one call; the passes fill plan / num_records / out.
inline Params make_params(const CallShape& cs, const at::Tensor& kv_score_buffer,
                          const at::Tensor& kv_score_input, const at::Tensor& ape,
                          const at::Tensor& out) {
  Params p{};
  p.state = kv_score_buffer.data_ptr();
  p.input = kv_score_input.data_ptr();
  p.ape = ape.data_ptr();
  p.plan = nullptr;
  p.out = out.data_ptr();
  p.num_state_rows = kv_score_buffer.numel() / state_row_elems(cs.cr, cs.hd, cs.online);
  p.num_in_rows = kv_score_input.size(0);
  p.in_row_stride = row_stride_of(kv_score_input);
  p.num_records = 0;
  p.num_out_rows = out.size(0);
  p.hd = cs.hd;
  p.cr = cs.cr;
  p.ape_type = ape_type_of(ape);
  p.out_type = out.scalar_type() == at::kFloat ? kOutF32 : kOutBF16;
  p.online_store = 0;
  p.after_pool = 0;
  p.records_per_block = 1;
  p.early_trigger = 0;
  return p;
}

inline Params pass_params(Params p, const at::Tensor& records, bool writes_out) {
  p.plan = records.data_ptr<uint8_t>();
  p.num_records = records.size(0);
  if (!writes_out) p.out = nullptr;
  return p;
}

// The offline prefill's plan_w row writes (GPU), launched right after the pooling kernel of
// the same call when the plan has records (Params::after_pool, write_rows.cuh).
inline Params row_write_params(const Params& base, const at::Tensor& plan,
                               const at::Tensor& plan_w) {
  Params pw = pass_params(base, plan_w, false);
  pw.after_pool = plan.size(0) > 0 ? 1 : 0;
  return pw;
}

}  // namespace compress
}  // namespace dsv4
