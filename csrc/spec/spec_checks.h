// Argument checks of the online cr = 128 draft ops (docs/contract.md 10), shared by the CPU and
// the CUDA/HIP glue, and the translation of the checked tensors into the torch-free kernel
// parameters (include/dsv4/spec_math.h).
#pragma once

#include <ATen/ATen.h>

#include <utility>

#include "compress/compress_checks.h"
#include "include/dsv4/spec_math.h"
#include "op_checks.h"

namespace dsv4 {
namespace spec {

constexpr const char* kWritePrefixOp = "online_c128_mtp_write_prefix_states";
constexpr const char* kMarkPendingOp = "online_c128_mtp_mark_pending";
constexpr const char* kCommitPendingOp = "online_c128_mtp_commit_pending";

inline int32_t index_type_of(const at::Tensor& t) {
  return t.scalar_type() == at::kLong ? kIdx64 : kIdx32;
}

// seq_lens / req_pool_indices: 1-D int32 or int64, contiguous, at least `batch` entries.
inline void check_index_vector(const at::Tensor& t, const char* op, const char* arg,
                               int64_t batch, const at::Device& dev) {
  check_dtype(t, op, arg, {at::kInt, at::kLong});
  check_dim(t, op, arg, 1);
  check_contiguous(t, op, arg);
  check_device(t, dev, op, arg);
  DSV4_CHECK(batch <= t.size(0), op, arg, "has ", t.size(0), " entries, fewer than batch_size ",
             batch);
}

inline void check_req_to_token(const at::Tensor& t, const char* op, const at::Device& dev) {
  check_dtype(t, op, "req_to_token", {at::kInt});
  check_dim(t, op, "req_to_token", 2);
  check_device(t, dev, op, "req_to_token");
}

inline void check_pending(const at::Tensor& t, const char* op, int64_t num_req_slots,
                          const at::Device& dev) {
  check_dtype(t, op, "pending_seq_lens", {at::kLong});
  check_dim(t, op, "pending_seq_lens", 1);
  check_contiguous(t, op, "pending_seq_lens");
  check_device(t, dev, op, "pending_seq_lens");
  DSV4_CHECK(num_req_slots >= 0 && num_req_slots <= t.size(0), op, "num_req_slots",
             "must lie in [0, ", t.size(0), "] (the entries of pending_seq_lens), got ",
             num_req_slots);
}

// The online state: fp32 / bf16, any leading shape, rows of 3*head_dim, contiguous.
inline int64_t check_state(const at::Tensor& state, const char* op, int64_t head_dim) {
  DSV4_CHECK(head_dim == 128 || head_dim == 512, op, "head_dim", "must be 128 or 512, got ",
             head_dim);
  check_dtype(state, op, "state", {at::kFloat, at::kBFloat16});
  DSV4_CHECK(state.dim() >= 2 && state.size(-1) == 3 * head_dim, op, "state",
             "must be [num_slots, ", 3 * head_dim, "] (m | S | K rows, any leading shape), got "
             "shape ", state.sizes());
  check_contiguous(state, op, "state");
  check_no_grad(state, op, "state");
  return state.numel() / (3 * head_dim);
}

inline void check_verify(const char* op, int64_t num_verify_tokens, int64_t state_slot_stride) {
  DSV4_CHECK(num_verify_tokens >= 1, op, "num_verify_tokens", "must be at least 1, got ",
             num_verify_tokens);
  DSV4_CHECK(state_slot_stride >= 1, op, "state_slot_stride", "must be at least 1, got ",
             state_slot_stride);
}

inline WritePrefixParams check_write_prefix(const at::Tensor& kv_score_input,
                                            const at::Tensor& seq_lens,
                                            const at::Tensor& req_pool_indices,
                                            const at::Tensor& req_to_token, const at::Tensor& ape,
                                            const at::Tensor& state, int64_t batch_size,
                                            int64_t num_verify_tokens, int64_t state_slot_stride,
                                            int64_t head_dim) {
  const char* op = kWritePrefixOp;
  const int64_t rows = check_state(state, op, head_dim);
  const at::Device dev = state.device();
  const int hd = int(head_dim);
  check_dtype(kv_score_input, op, "kv_score_input", {at::kFloat, at::kBFloat16});
  check_dim(kv_score_input, op, "kv_score_input", 2);
  DSV4_CHECK(kv_score_input.size(1) == 2 * head_dim, op, "kv_score_input", "must have ",
             2 * head_dim, " columns (kv | score), got shape ", kv_score_input.sizes());
  check_strided_rows(kv_score_input, op, "kv_score_input");
  check_device(kv_score_input, dev, op, "kv_score_input");
  check_no_grad(kv_score_input, op, "kv_score_input");
  check_dtype(ape, op, "ape", {at::kFloat, at::kBFloat16, at::kHalf});
  DSV4_CHECK(ape.dim() == 2 && ape.size(0) == 128 && ape.size(1) == head_dim, op, "ape",
             "must be [128, ", head_dim, "], got shape ", ape.sizes());
  check_contiguous(ape, op, "ape");
  check_device(ape, dev, op, "ape");
  check_no_grad(ape, op, "ape");
  check_req_to_token(req_to_token, op, dev);
  const int64_t batch = batch_size > 0 ? batch_size : 0;
  check_index_vector(seq_lens, op, "seq_lens", batch, dev);
  check_index_vector(req_pool_indices, op, "req_pool_indices", batch, dev);
  check_verify(op, num_verify_tokens, state_slot_stride);
  DSV4_CHECK(batch * num_verify_tokens <= kv_score_input.size(0), op, "kv_score_input",
             "has ", kv_score_input.size(0), " rows, fewer than batch_size x num_verify_tokens = ",
             batch * num_verify_tokens);
  // The op writes the state while it reads the others.
  check_no_overlap_rows(state, "state", kv_score_input, "kv_score_input", op);
  const std::pair<const at::Tensor*, const char*> inputs[] = {
      {&seq_lens, "seq_lens"}, {&req_pool_indices, "req_pool_indices"}, {&ape, "ape"}};
  for (const auto& in : inputs) check_no_overlap(state, "state", *in.first, in.second, op);

  WritePrefixParams p{};
  p.input = kv_score_input.data_ptr();
  p.seq_lens = seq_lens.data_ptr();
  p.req = req_pool_indices.data_ptr();
  p.ape = ape.data_ptr();
  p.state = state.data_ptr();
  p.num_state_rows = rows;
  p.in_row_stride = row_stride_of(kv_score_input);
  p.batch = batch;
  p.verify = num_verify_tokens;
  p.slot_stride = state_slot_stride;
  p.hd = hd;
  p.seq_type = index_type_of(seq_lens);
  p.req_type = index_type_of(req_pool_indices);
  p.ape_type = compress::ape_type_of(ape);
  return p;
}

inline MarkPendingParams check_mark_pending(const at::Tensor& seq_lens,
                                            const at::Tensor& req_pool_indices,
                                            const at::Tensor& pending_seq_lens,
                                            int64_t batch_size, int64_t num_req_slots) {
  const char* op = kMarkPendingOp;
  const at::Device dev = pending_seq_lens.device();
  const int64_t batch = batch_size > 0 ? batch_size : 0;
  check_pending(pending_seq_lens, op, num_req_slots, dev);
  check_index_vector(seq_lens, op, "seq_lens", batch, dev);
  check_index_vector(req_pool_indices, op, "req_pool_indices", batch, dev);
  check_no_grad(pending_seq_lens, op, "pending_seq_lens");
  check_no_overlap(pending_seq_lens, "pending_seq_lens", seq_lens, "seq_lens", op);
  check_no_overlap(pending_seq_lens, "pending_seq_lens", req_pool_indices, "req_pool_indices",
                   op);
  MarkPendingParams p{};
  p.seq_lens = seq_lens.data_ptr();
  p.req = req_pool_indices.data_ptr();
  p.pending = pending_seq_lens.data_ptr<int64_t>();
  p.batch = batch;
  p.num_req_slots = num_req_slots;
  p.seq_type = index_type_of(seq_lens);
  p.req_type = index_type_of(req_pool_indices);
  return p;
}

inline CommitPendingParams check_commit_pending(
    const at::Tensor& seq_lens, const at::Tensor& req_pool_indices,
    const at::Tensor& req_to_token, const at::Tensor& pending_seq_lens, const at::Tensor& state,
    int64_t batch_size, int64_t num_verify_tokens, int64_t state_slot_stride,
    int64_t num_req_slots, int64_t head_dim) {
  const char* op = kCommitPendingOp;
  const int64_t rows = check_state(state, op, head_dim);
  const at::Device dev = state.device();
  const int64_t batch = batch_size > 0 ? batch_size : 0;
  check_index_vector(seq_lens, op, "seq_lens", batch, dev);
  check_index_vector(req_pool_indices, op, "req_pool_indices", batch, dev);
  check_req_to_token(req_to_token, op, dev);
  check_pending(pending_seq_lens, op, num_req_slots, dev);
  check_verify(op, num_verify_tokens, state_slot_stride);
  const std::pair<const at::Tensor*, const char*> inputs[] = {
      {&seq_lens, "seq_lens"}, {&req_pool_indices, "req_pool_indices"},
      {&pending_seq_lens, "pending_seq_lens"}};
  for (const auto& in : inputs) check_no_overlap(state, "state", *in.first, in.second, op);

  CommitPendingParams p{};
  p.seq_lens = seq_lens.data_ptr();
  p.req = req_pool_indices.data_ptr();
  p.pending = pending_seq_lens.data_ptr<int64_t>();
  p.state = state.data_ptr();
  p.num_state_rows = rows;
  p.row_bytes = 3 * head_dim * int64_t(state.element_size());
  p.batch = batch;
  p.verify = num_verify_tokens;
  p.slot_stride = state_slot_stride;
  p.num_req_slots = num_req_slots;
  p.seq_type = index_type_of(seq_lens);
  p.req_type = index_type_of(req_pool_indices);
  return p;
}

}  // namespace spec
}  // namespace dsv4
