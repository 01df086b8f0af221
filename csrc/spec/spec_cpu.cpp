// The online cr = 128 draft ops on the CPU (docs/contract.md 10): plain C++ over
// at::parallel_for, the math of include/dsv4/spec_math.h.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#include "spec/spec_checks.h"

namespace dsv4 {
namespace spec {
namespace {

template <typename TS, typename TI>
void write_prefix_cpu(const WritePrefixParams& p) {
  // A request is hd channels x D tokens of work: a few requests per task.
  at::parallel_for(0, p.batch, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const StageEntry e = stage_entry(p, b);
      if (!e.active) continue;
      for (int c = 0; c < p.hd; ++c) stage_channel<TS, TI>(p, e, b, c);
    }
  });
}

void write_prefix_states_cpu(const at::Tensor& kv_score_input, const at::Tensor& seq_lens,
                             const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                             const at::Tensor& ape, at::Tensor state, int64_t batch_size,
                             int64_t num_verify_tokens, int64_t state_slot_stride,
                             int64_t head_dim) {
  const WritePrefixParams p =
      check_write_prefix(kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state,
                         batch_size, num_verify_tokens, state_slot_stride, head_dim);
  DSV4_CHECK(state.device().is_cpu(), kWritePrefixOp, "state",
             "must be a CPU tensor for the CPU kernel, got ", state.device());
  const bool st_bf16 = state.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  if (!st_bf16 && !in_bf16)
    write_prefix_cpu<float, float>(p);
  else if (!st_bf16 && in_bf16)
    write_prefix_cpu<float, uint16_t>(p);
  else if (st_bf16 && !in_bf16)
    write_prefix_cpu<uint16_t, float>(p);
  else
    write_prefix_cpu<uint16_t, uint16_t>(p);
}

void mark_pending_cpu(const at::Tensor& seq_lens, const at::Tensor& req_pool_indices,
                      at::Tensor pending_seq_lens, int64_t batch_size, int64_t num_req_slots) {
  const MarkPendingParams p =
      check_mark_pending(seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots);
  DSV4_CHECK(pending_seq_lens.device().is_cpu(), kMarkPendingOp, "pending_seq_lens",
             "must be a CPU tensor for the CPU kernel, got ", pending_seq_lens.device());
  if (p.batch == 0) return;
  for (int64_t r = 0; r < p.num_req_slots; ++r) p.pending[r] = -1;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t r = pending_row(p, b);
    if (r >= 0) p.pending[r] = load_index(p.seq_lens, p.seq_type, b);
  }
}

void commit_pending_cpu(const at::Tensor& seq_lens, const at::Tensor& req_pool_indices,
                        const at::Tensor& req_to_token, const at::Tensor& pending_seq_lens,
                        at::Tensor state, int64_t batch_size, int64_t num_verify_tokens,
                        int64_t state_slot_stride, int64_t num_req_slots, int64_t head_dim) {
  const CommitPendingParams p =
      check_commit_pending(seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state,
                           batch_size, num_verify_tokens, state_slot_stride, num_req_slots,
                           head_dim);
  DSV4_CHECK(state.device().is_cpu(), kCommitPendingOp, "state",
             "must be a CPU tensor for the CPU kernel, got ", state.device());
  auto* st = static_cast<uint8_t*>(p.state);
  at::parallel_for(0, p.batch, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const CommitMove m = commit_move(p, b);
      if (m.src >= 0) std::memcpy(st + m.dst * p.row_bytes, st + m.src * p.row_bytes,
                                  size_t(p.row_bytes));
    }
  });
}

}  // namespace
}  // namespace spec
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("online_c128_mtp_write_prefix_states", &dsv4::spec::write_prefix_states_cpu);
  m.impl("online_c128_mtp_mark_pending", &dsv4::spec::mark_pending_cpu);
  m.impl("online_c128_mtp_commit_pending", &dsv4::spec::commit_pending_cpu);
}
