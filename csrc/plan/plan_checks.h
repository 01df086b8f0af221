// Argument checks and parameter set-up of the planner ops, shared by the CPU and the CUDA glue
// (one piece of code for one piece of logic). Every error names the op and the argument.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "include/dsv4/plan_math.h"
#include "op_checks.h"

namespace dsv4 {
namespace plan {

// int64 1-D index / length vectors (the Python wrappers convert to int64).
inline void check_vector(const at::Tensor& t, const char* op, const char* arg) {
  check_dtype(t, op, arg, {at::kLong});
  check_dim(t, op, arg, 1);
}

// req_pool_indices and the lengths: int64 [B] each; the lengths on one device, which is either
// the host or the plan device (that of req_pool_indices). Returns whether they are on the host.
inline bool check_batch(const char* op, const at::Tensor& req_pool_indices,
                        const at::Tensor& seq_lens, const at::Tensor* extend_lens) {
  check_vector(req_pool_indices, op, "req_pool_indices");
  check_vector(seq_lens, op, "seq_lens");
  const int64_t B = req_pool_indices.size(0);
  DSV4_CHECK(seq_lens.size(0) == B, op, "seq_lens", "must have one entry per request (", B,
             "), got ", seq_lens.size(0));
  if (extend_lens != nullptr) {
    check_vector(*extend_lens, op, "extend_lens");
    DSV4_CHECK(extend_lens->size(0) == B, op, "extend_lens",
               "must have one entry per request (", B, "), got ", extend_lens->size(0));
    DSV4_CHECK(extend_lens->device() == seq_lens.device(), op, "extend_lens",
               "must be on the device of seq_lens (", seq_lens.device(), "), got ",
               extend_lens->device());
  }
  const bool host = seq_lens.device().is_cpu();
  DSV4_CHECK(host || seq_lens.device() == req_pool_indices.device(), op, "seq_lens",
             "must be on the host or on the device of req_pool_indices (",
             req_pool_indices.device(), "), got ", seq_lens.device());
  return host;
}

// Prefill limits (docs/contract.md 3.3): ragged ids and batch indices fit 16 bits.
inline void check_prefill_limits(const char* op, int64_t batch, int64_t num_q_tokens) {
  DSV4_CHECK(num_q_tokens >= 0 && num_q_tokens <= kMaxQueryTokens, op, "num_q_tokens",
             "must be in [0, ", kMaxQueryTokens, "] (ragged ids are 16-bit), got ",
             num_q_tokens);
  DSV4_CHECK(batch <= kMaxBatch, op, "req_pool_indices", "batch size must be <= ", kMaxBatch,
             " (batch indices are 16-bit), got ", batch);
}

// Host lengths: 0 <= extend_len <= seq_len < 2^31 and sum(extend_lens) <= num_q_tokens.
// `seq_lens` / `extend_lens` are contiguous host int64 tensors.
inline void validate_host_lengths(const char* op, const at::Tensor& seq_lens,
                                  const at::Tensor& extend_lens, int64_t num_q_tokens) {
  const int64_t* sl = seq_lens.data_ptr<int64_t>();
  const int64_t* el = extend_lens.data_ptr<int64_t>();
  int64_t sum = 0;
  for (int64_t i = 0; i < seq_lens.size(0); ++i) {
    DSV4_CHECK(sl[i] >= 0 && sl[i] <= kMaxInt32, op, "seq_lens", "entry ", i,
               " must be in [0, 2^31), got ", sl[i]);
    DSV4_CHECK(el[i] >= 0 && el[i] <= sl[i], op, "extend_lens", "entry ", i,
               " must be in [0, seq_lens[", i, "] = ", sl[i], "], got ", el[i]);
    sum += el[i];
  }
  DSV4_CHECK(sum <= num_q_tokens, op, "extend_lens", "sum (", sum,
             ") must not exceed num_q_tokens (", num_q_tokens, ")");
}

// Per-request offsets from host lengths (validated first), into `offs` (B + 1 entries).
inline void host_request_offsets(const char* op, const PlanParams& p, const at::Tensor& seq_lens,
                                 const at::Tensor& extend_lens, int64_t num_q_tokens,
                                 ReqOffsets* offs) {
  const at::Tensor sl = seq_lens.contiguous();
  const at::Tensor el = extend_lens.contiguous();
  validate_host_lengths(op, sl, el, num_q_tokens);
  build_request_offsets(p, sl.data_ptr<int64_t>(), el.data_ptr<int64_t>(), sl.size(0),
                        num_q_tokens, offs);
}

// SWA-paged / request-ring parameters (contract 2.1) for plan_decode / plan_prefill. The tables
// must be on `dev` (the plan device); full_to_state is only checked where it is used
// (SWA-paged addressing).
inline PlanParams paged_params(const char* op, const at::Tensor& req_to_token,
                               const at::Tensor& full_to_state, int64_t cr, int64_t sps,
                               int64_t ring, bool use_req_ring, const at::Device& dev) {
  check_ratio(cr, op);
  const bool req_ring = use_req_ring || cr == 128;
  DSV4_CHECK(ring > 0 && ring <= kMaxInt32, op, "ring_size", "must be in [1, 2^31), got ", ring);
  DSV4_CHECK(ring % cr == 0, op, "ring_size", "must be a multiple of compress_ratio (", cr,
             "), got ", ring);
  check_dtype(req_to_token, op, "req_to_token", {at::kInt});
  check_dim(req_to_token, op, "req_to_token", 2);
  check_device(req_to_token, dev, op, "req_to_token");
  DSV4_CHECK(req_to_token.size(1) <= 1 || req_to_token.stride(1) == 1, op, "req_to_token",
             "must have unit column stride, got strides ", req_to_token.strides());
  // A ring shorter than the window (8 rows for cr = 4, 128 for cr = 128, contract 1.2) overwrites
  // rows that the window still reads, whatever the addressing.
  const int64_t win = window_of(int(cr));
  DSV4_CHECK(ring >= win, op, "ring_size", "must be >= the window (", win, ") with ",
             req_ring ? "request-ring" : "SWA-paged", " addressing, got ", ring);
  if (req_ring) {
    return paged_plan_params(int32_t(cr), true, 1, ring, nullptr, 0, 0, 0, nullptr, 0);
  }
  DSV4_CHECK(sps > 0 && sps <= kMaxInt32, op, "swa_page_size", "must be in [1, 2^31), got ",
             sps);
  DSV4_CHECK(sps % ring == 0, op, "swa_page_size", "must be a multiple of ring_size (", ring,
             "), got ", sps);
  check_dtype(full_to_state, op, "full_to_state", {at::kLong});
  check_dim(full_to_state, op, "full_to_state", 1);
  check_contiguous(full_to_state, op, "full_to_state");
  check_device(full_to_state, dev, op, "full_to_state");
  return paged_plan_params(int32_t(cr), false, sps, ring, req_to_token.data_ptr<int32_t>(),
                           req_to_token.size(0), req_to_token.stride(0), req_to_token.size(1),
                           full_to_state.data_ptr<int64_t>(), full_to_state.size(0));
}

inline PlanParams legacy_params(const char* op, int64_t cr) {
  check_ratio(cr, op);
  return legacy_plan_params(int32_t(cr));
}

inline PlanParams online_params(const char* op, int64_t state_slot_offset) {
  DSV4_CHECK(state_slot_offset >= 0 && state_slot_offset <= kMaxInt32, op, "state_slot_offset",
             "must be in [0, 2^31), got ", state_slot_offset);
  return online_plan_params(state_slot_offset);
}

// Output tensors of a prefill planner on `dev`.
struct PrefillOutputs {
  at::Tensor plan_c, plan_w;
};

inline PrefillOutputs prefill_outputs(const PlanParams& p, int64_t num_q_tokens,
                                      const at::Device& dev) {
  const auto opts = at::TensorOptions().dtype(at::kByte).device(dev);
  const int64_t w_bytes = p.online ? int64_t(sizeof(CompressPlan)) : int64_t(sizeof(WritePlan));
  return PrefillOutputs{at::empty({num_q_tokens, int64_t(sizeof(CompressPlan))}, opts),
                        at::empty({num_q_tokens, w_bytes}, opts)};
}

}  // namespace plan
}  // namespace dsv4
