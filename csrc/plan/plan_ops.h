// The six planner ops, written once over a backend: argument checks, plan parameters, then the
// backend's decode or prefill planner. plan_cpu.cpp and plan_cuda.cu each define a backend and
// register these ops for their dispatch key, so both backends check the same things in the
// same order and report the same errors.
//
// A Backend provides
//   static void check_plan_device(const char* op, const at::Tensor& req_pool_indices);
//       that req_pool_indices is on a device of this backend (the plan device); plan_decode
//       and the prefill ops check it before their tables and limits (CPU: nothing to check);
//   static at::Tensor decode(const char* op, const PlanParams& p,
//                            const at::Tensor& req_pool_indices, const at::Tensor& seq_lens);
//   static PrefillPlans prefill(const char* op, const PlanParams& p,
//                               const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
//                               const at::Tensor& extend_lens, int64_t num_q_tokens,
//                               bool host_lengths);
#pragma once

#include <torch/library.h>

#include <tuple>

#include "plan/plan_checks.h"

namespace dsv4 {
namespace plan {

// (plan_c, plan_w, counts) of a prefill planner.
using PrefillPlans = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

template <typename Backend>
struct PlannerOps {
  static at::Tensor plan_decode(const at::Tensor& req_pool_indices,
                                const at::Tensor& req_to_token, const at::Tensor& full_to_state,
                                const at::Tensor& seq_lens, int64_t compress_ratio,
                                int64_t swa_page_size, int64_t ring_size, bool use_req_ring) {
    const char* op = "plan_decode";
    return decode(op, req_pool_indices, seq_lens, [&] {
      Backend::check_plan_device(op, req_pool_indices);
      return paged_params(op, req_to_token, full_to_state, compress_ratio, swa_page_size,
                          ring_size, use_req_ring, req_pool_indices.device());
    });
  }

  static at::Tensor plan_decode_legacy(const at::Tensor& req_pool_indices,
                                       const at::Tensor& seq_lens, int64_t compress_ratio) {
    const char* op = "plan_decode_legacy";
    return decode(op, req_pool_indices, seq_lens,
                  [&] { return legacy_params(op, compress_ratio); });
  }

  static at::Tensor plan_online_decode(const at::Tensor& req_pool_indices,
                                       const at::Tensor& seq_lens, int64_t state_slot_offset) {
    const char* op = "plan_online_decode";
    return decode(op, req_pool_indices, seq_lens,
                  [&] { return online_params(op, state_slot_offset); });
  }

  static PrefillPlans plan_prefill(const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                   const at::Tensor& extend_lens, const at::Tensor& req_to_token,
                                   const at::Tensor& full_to_state, int64_t compress_ratio,
                                   int64_t swa_page_size, int64_t ring_size, int64_t num_q_tokens,
                                   bool use_req_ring) {
    const char* op = "plan_prefill";
    return prefill(op, req_pool_indices, seq_lens, extend_lens, num_q_tokens, [&] {
      return paged_params(op, req_to_token, full_to_state, compress_ratio, swa_page_size,
                          ring_size, use_req_ring, req_pool_indices.device());
    });
  }

  static PrefillPlans plan_prefill_legacy(const at::Tensor& req_pool_indices,
                                          const at::Tensor& seq_lens,
                                          const at::Tensor& extend_lens, int64_t compress_ratio,
                                          int64_t num_q_tokens) {
    const char* op = "plan_prefill_legacy";
    return prefill(op, req_pool_indices, seq_lens, extend_lens, num_q_tokens,
                   [&] { return legacy_params(op, compress_ratio); });
  }

  static PrefillPlans plan_online_prefill(const at::Tensor& req_pool_indices,
                                          const at::Tensor& seq_lens,
                                          const at::Tensor& extend_lens, int64_t num_q_tokens,
                                          int64_t state_slot_offset) {
    const char* op = "plan_online_prefill";
    return prefill(op, req_pool_indices, seq_lens, extend_lens, num_q_tokens,
                   [&] { return online_params(op, state_slot_offset); });
  }

 private:
  // Decode: the batch checks, then `make_params()` (its checks), then the backend's planner.
  template <typename MakeParams>
  static at::Tensor decode(const char* op, const at::Tensor& req_pool_indices,
                           const at::Tensor& seq_lens, MakeParams make_params) {
    check_batch(op, req_pool_indices, seq_lens, nullptr);
    const PlanParams p = make_params();
    return Backend::decode(op, p, req_pool_indices, seq_lens);
  }

  // Prefill: the batch checks (the vectors, the plan device, the limits), then `make_params()`
  // (its checks), then the backend's planner.
  template <typename MakeParams>
  static PrefillPlans prefill(const char* op, const at::Tensor& req_pool_indices,
                              const at::Tensor& seq_lens, const at::Tensor& extend_lens,
                              int64_t num_q_tokens, MakeParams make_params) {
    const bool host = check_batch(op, req_pool_indices, seq_lens, &extend_lens);
    Backend::check_plan_device(op, req_pool_indices);
    check_prefill_limits(op, req_pool_indices.size(0), num_q_tokens);
    const PlanParams p = make_params();
    return Backend::prefill(op, p, req_pool_indices, seq_lens, extend_lens, num_q_tokens, host);
  }
};

// Registers the six planner ops of `Backend` in a TORCH_LIBRARY_IMPL block.
template <typename Backend>
void register_planner_ops(torch::Library& m) {
  using Ops = PlannerOps<Backend>;
  m.impl("plan_decode", &Ops::plan_decode);
  m.impl("plan_decode_legacy", &Ops::plan_decode_legacy);
  m.impl("plan_online_decode", &Ops::plan_online_decode);
  m.impl("plan_prefill", &Ops::plan_prefill);
  m.impl("plan_prefill_legacy", &Ops::plan_prefill_legacy);
  m.impl("plan_online_prefill", &Ops::plan_online_prefill);
}

}  // namespace plan
}  // namespace dsv4
