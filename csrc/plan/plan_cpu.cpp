// CPU planners: the glue around plan_math.h (the same per-item math as the GPU planners, so
// CPU and GPU plans are byte-identical).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

#include "plan/plan_checks.h"

namespace dsv4 {
namespace {

at::Tensor decode_cpu(const char* op, const PlanParams& p, const at::Tensor& req_pool_indices,
                      const at::Tensor& seq_lens) {
  check_device(seq_lens, req_pool_indices.device(), op, "seq_lens");
  const at::Tensor rpi = req_pool_indices.contiguous();
  const at::Tensor sl = seq_lens.contiguous();
  const int64_t B = rpi.size(0);
  at::Tensor plan = at::empty({B, int64_t(sizeof(DecodePlan))}, rpi.options().dtype(at::kByte));
  const int64_t* rp = rpi.data_ptr<int64_t>();
  const int64_t* s = sl.data_ptr<int64_t>();
  DecodePlan* out = reinterpret_cast<DecodePlan*>(plan.data_ptr<uint8_t>());
  at::parallel_for(0, B, 4096, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) out[b] = decode_record(p, rp[b], s[b]);
  });
  return plan;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> prefill_cpu(
    const char* op, const PlanParams& p, const at::Tensor& req_pool_indices,
    const at::Tensor& seq_lens, const at::Tensor& extend_lens, int64_t num_q_tokens) {
  const int64_t B = req_pool_indices.size(0);
  std::vector<ReqOffsets> offs(size_t(B) + 1);
  plan::host_request_offsets(op, p, seq_lens, extend_lens, num_q_tokens, offs.data());
  const at::Tensor rpi = req_pool_indices.contiguous();
  plan::PrefillOutputs o = plan::prefill_outputs(p, num_q_tokens, rpi.device());
  const int64_t* rp = rpi.data_ptr<int64_t>();
  uint8_t* pc = o.plan_c.data_ptr<uint8_t>();
  uint8_t* pw = o.plan_w.data_ptr<uint8_t>();
  const ReqOffsets* of = offs.data();
  at::parallel_for(0, num_q_tokens, 2048, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) plan_prefill_row(p, rp, of, int32_t(B), t, pc, pw);
  });
  at::Tensor counts = at::empty({2}, seq_lens.options().dtype(at::kInt));
  counts.data_ptr<int32_t>()[0] = offs[size_t(B)].c;
  counts.data_ptr<int32_t>()[1] = offs[size_t(B)].w;
  return {o.plan_c, o.plan_w, counts};
}

at::Tensor plan_decode_cpu(const at::Tensor& req_pool_indices, const at::Tensor& req_to_token,
                           const at::Tensor& full_to_state, const at::Tensor& seq_lens,
                           int64_t compress_ratio, int64_t swa_page_size, int64_t ring_size,
                           bool use_req_ring) {
  const char* op = "plan_decode";
  plan::check_batch(op, req_pool_indices, seq_lens, nullptr);
  const PlanParams p = plan::paged_params(op, req_to_token, full_to_state, compress_ratio,
                                          swa_page_size, ring_size, use_req_ring,
                                          req_pool_indices.device());
  return decode_cpu(op, p, req_pool_indices, seq_lens);
}

at::Tensor plan_decode_legacy_cpu(const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                  int64_t compress_ratio) {
  const char* op = "plan_decode_legacy";
  plan::check_batch(op, req_pool_indices, seq_lens, nullptr);
  return decode_cpu(op, plan::legacy_params(op, compress_ratio), req_pool_indices, seq_lens);
}

at::Tensor plan_online_decode_cpu(const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                                  int64_t state_slot_offset) {
  const char* op = "plan_online_decode";
  plan::check_batch(op, req_pool_indices, seq_lens, nullptr);
  return decode_cpu(op, plan::online_params(op, state_slot_offset), req_pool_indices, seq_lens);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> plan_prefill_cpu(
    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, const at::Tensor& extend_lens,
    const at::Tensor& req_to_token, const at::Tensor& full_to_state, int64_t compress_ratio,
    int64_t swa_page_size, int64_t ring_size, int64_t num_q_tokens, bool use_req_ring) {
  const char* op = "plan_prefill";
  plan::check_batch(op, req_pool_indices, seq_lens, &extend_lens);
  plan::check_prefill_limits(op, req_pool_indices.size(0), num_q_tokens);
  const PlanParams p = plan::paged_params(op, req_to_token, full_to_state, compress_ratio,
                                          swa_page_size, ring_size, use_req_ring,
                                          req_pool_indices.device());
  return prefill_cpu(op, p, req_pool_indices, seq_lens, extend_lens, num_q_tokens);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> plan_prefill_legacy_cpu(
    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, const at::Tensor& extend_lens,
    int64_t compress_ratio, int64_t num_q_tokens) {
  const char* op = "plan_prefill_legacy";
  plan::check_batch(op, req_pool_indices, seq_lens, &extend_lens);
  plan::check_prefill_limits(op, req_pool_indices.size(0), num_q_tokens);
  return prefill_cpu(op, plan::legacy_params(op, compress_ratio), req_pool_indices, seq_lens,
                     extend_lens, num_q_tokens);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> plan_online_prefill_cpu(
    const at::Tensor& req_pool_indices, const at::Tensor& seq_lens, const at::Tensor& extend_lens,
    int64_t num_q_tokens, int64_t state_slot_offset) {
  const char* op = "plan_online_prefill";
  plan::check_batch(op, req_pool_indices, seq_lens, &extend_lens);
  plan::check_prefill_limits(op, req_pool_indices.size(0), num_q_tokens);
  return prefill_cpu(op, plan::online_params(op, state_slot_offset), req_pool_indices, seq_lens,
                     extend_lens, num_q_tokens);
}

}  // namespace

TORCH_LIBRARY_IMPL(dsv4, CPU, m) {
  m.impl("plan_decode", &plan_decode_cpu);
  m.impl("plan_decode_legacy", &plan_decode_legacy_cpu);
  m.impl("plan_online_decode", &plan_online_decode_cpu);
  m.impl("plan_prefill", &plan_prefill_cpu);
  m.impl("plan_prefill_legacy", &plan_prefill_legacy_cpu);
  m.impl("plan_online_prefill", &plan_online_prefill_cpu);
}

}  // namespace dsv4
