// The online cr = 128 draft ops on CUDA / HIP (docs/contract.md 10): argument checks (shared
// with the CPU glue), device guard, current stream, PDL-aware launches of the kernels in
// include/dsv4/spec/. No host sync, no host allocation: safe inside CUDA-graph capture.
#include <torch/library.h>

#include "cuda_glue.h"
#include "include/dsv4/spec/commit_pending_kernel.cuh"
#include "include/dsv4/spec/mark_pending_kernel.cuh"
#include "include/dsv4/spec/write_prefix_kernel.cuh"
#include "spec/spec_checks.h"

namespace dsv4 {
namespace spec {
namespace {

using WritePrefixKernel = void (*)(const WritePrefixParams);

template <int kHd>
WritePrefixKernel write_prefix_kernel_for(bool st_bf16, bool in_bf16) {
  return !st_bf16 ? (!in_bf16 ? write_prefix_kernel<float, float, kHd>
                              : write_prefix_kernel<float, uint16_t, kHd>)
                  : (!in_bf16 ? write_prefix_kernel<uint16_t, float, kHd>
                              : write_prefix_kernel<uint16_t, uint16_t, kHd>);
}

// The kernel moves kStageVec channels as one vector: every row it reads or writes must start
// on that vector's boundary.
void check_stage_alignment(const at::Tensor& kv_score_input, const at::Tensor& ape,
                           const at::Tensor& state) {
  const std::pair<const at::Tensor*, const char*> vec[] = {
      {&kv_score_input, "kv_score_input"}, {&ape, "ape"}, {&state, "state"}};
  for (const auto& t : vec) {
    const int64_t bytes = kStageVec * t.first->element_size();
    DSV4_CHECK(aligned(t.first->data_ptr(), uintptr_t(bytes)), kWritePrefixOp, t.second,
               "must start on a ", bytes, "-byte boundary on the GPU (got a view at an "
               "unaligned offset)");
  }
  DSV4_CHECK(kv_score_input.size(0) <= 1 || kv_score_input.stride(0) % kStageVec == 0,
             kWritePrefixOp, "kv_score_input", "must have a row stride that is a multiple of ",
             kStageVec, " elements on the GPU, got strides ", kv_score_input.strides());
}

void write_prefix_states_cuda(const at::Tensor& kv_score_input, const at::Tensor& seq_lens,
                              const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                              const at::Tensor& ape, at::Tensor state, int64_t batch_size,
                              int64_t num_verify_tokens, int64_t state_slot_stride,
                              int64_t head_dim) {
  const WritePrefixParams p =
      check_write_prefix(kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state,
                         batch_size, num_verify_tokens, state_slot_stride, head_dim);
  DSV4_CHECK(state.is_cuda(), kWritePrefixOp, "state",
             "must be a CUDA tensor for the CUDA kernel, got ", state.device());
  DSV4_CHECK(p.batch < (int64_t(1) << 30), kWritePrefixOp, "batch_size",
             "must be below 2^30 (the grid holds 2 blocks a request), got ", p.batch);
  check_stage_alignment(kv_score_input, ape, state);
  const c10::cuda::OptionalCUDAGuard guard(state.device());
  const LaunchEnv env = launch_env(state);
  const bool st_bf16 = state.scalar_type() == at::kBFloat16;
  const bool in_bf16 = kv_score_input.scalar_type() == at::kBFloat16;
  const WritePrefixKernel kernel = p.hd == 512 ? write_prefix_kernel_for<512>(st_bf16, in_bf16)
                                               : write_prefix_kernel_for<128>(st_bf16, in_bf16);
  const dim3 grid(unsigned(stage_blocks(p.batch, p.hd)));
  launch_kernel(kernel, grid, dim3(kStageBlock), 0, env.stream, env.pdl, p);
  DSV4_CHECK_LAUNCH();
}

void mark_pending_cuda(const at::Tensor& seq_lens, const at::Tensor& req_pool_indices,
                       at::Tensor pending_seq_lens, int64_t batch_size, int64_t num_req_slots) {
  const MarkPendingParams p =
      check_mark_pending(seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots);
  DSV4_CHECK(pending_seq_lens.is_cuda(), kMarkPendingOp, "pending_seq_lens",
             "must be a CUDA tensor for the CUDA kernel, got ", pending_seq_lens.device());
  if (p.batch == 0) return;
  const c10::cuda::OptionalCUDAGuard guard(pending_seq_lens.device());
  const LaunchEnv env = launch_env(pending_seq_lens);
  launch_kernel(mark_pending_kernel, dim3(1), dim3(kMarkBlock), 0, env.stream, env.pdl, p);
  DSV4_CHECK_LAUNCH();
}

void commit_pending_cuda(const at::Tensor& seq_lens, const at::Tensor& req_pool_indices,
                         const at::Tensor& req_to_token, const at::Tensor& pending_seq_lens,
                         at::Tensor state, int64_t batch_size, int64_t num_verify_tokens,
                         int64_t state_slot_stride, int64_t num_req_slots, int64_t head_dim) {
  const CommitPendingParams p =
      check_commit_pending(seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state,
                           batch_size, num_verify_tokens, state_slot_stride, num_req_slots,
                           head_dim);
  DSV4_CHECK(state.is_cuda(), kCommitPendingOp, "state",
             "must be a CUDA tensor for the CUDA kernel, got ", state.device());
  DSV4_CHECK(aligned(state.data_ptr(), 16), kCommitPendingOp, "state",
             "must start on a 16-byte boundary");
  DSV4_CHECK(p.batch <= 0x7fffffff, kCommitPendingOp, "batch_size", "must be below 2^31, got ",
             p.batch);
  const c10::cuda::OptionalCUDAGuard guard(state.device());
  const LaunchEnv env = launch_env(state);
  launch_kernel(commit_pending_kernel, dim3(unsigned(p.batch)), dim3(kCommitBlock), 0,
                env.stream, env.pdl, p);
  DSV4_CHECK_LAUNCH();
}

}  // namespace
}  // namespace spec
}  // namespace dsv4

TORCH_LIBRARY_IMPL(dsv4, CUDA, m) {
  m.impl("online_c128_mtp_write_prefix_states", &dsv4::spec::write_prefix_states_cuda);
  m.impl("online_c128_mtp_mark_pending", &dsv4::spec::mark_pending_cuda);
  m.impl("online_c128_mtp_commit_pending", &dsv4::spec::commit_pending_cuda);
}
