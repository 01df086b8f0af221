// The one registration block: every dsv4 operator schema. Kernels register their CPU and
// CUDA/HIP implementations next to their code (csrc/<family>/*_cpu.cpp, *_cuda.cu); the fake
// (meta) implementations live in dsv4_ops/_fake.py.
//
// Conventions: plan tensors are uint8 [N, record_bytes] (docs/contract.md 3.1); mutated arguments are
// annotated (a!) and the ops that mutate return nothing (destination passing), so no op
// returns an alias of an input.
#include <torch/library.h>

TORCH_LIBRARY(dsv4, m) {
  // ---- planners (contract 3.2, 3.3, 3.5) ------------------------------------------------------
  // DecodePlan [B, 16] for SWA-paged (use_req_ring=False) or request-ring addressing.
  m.def(
      "plan_decode(Tensor req_pool_indices, Tensor req_to_token, Tensor full_to_state, "
      "Tensor seq_lens, int compress_ratio, int swa_page_size, int ring_size, "
      "bool use_req_ring) -> Tensor");
  // DecodePlan [B, 16] with legacy (per-request window) slots.
  m.def(
      "plan_decode_legacy(Tensor req_pool_indices, Tensor seq_lens, int compress_ratio) -> Tensor");
  // DecodePlan [B, 16] for the online cr=128 running state: slot = rid + state_slot_offset.
  m.def(
      "plan_online_decode(Tensor req_pool_indices, Tensor seq_lens, int state_slot_offset) "
      "-> Tensor");
  // (plan_c [num_q_tokens, 16], plan_w [num_q_tokens, 8], counts int32 [2] = valid rows of
  // each, on the device of seq_lens). seq_lens / extend_lens may live on the host.
  m.def(
      "plan_prefill(Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens, "
      "Tensor req_to_token, Tensor full_to_state, int compress_ratio, int swa_page_size, "
      "int ring_size, int num_q_tokens, bool use_req_ring) -> (Tensor, Tensor, Tensor)");
  // Legacy prefill planner: same outputs, legacy slots, no band rule and no pad.
  m.def(
      "plan_prefill_legacy(Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens, "
      "int compress_ratio, int num_q_tokens) -> (Tensor, Tensor, Tensor)");
  // Online prefill planner: 128-chunk segments; plan_c closes chunks, plan_w [num_q_tokens, 16]
  // holds each request's trailing partial segment.
  m.def(
      "plan_online_prefill(Tensor req_pool_indices, Tensor seq_lens, Tensor extend_lens, "
      "int num_q_tokens, int state_slot_offset) -> (Tensor, Tensor, Tensor)");

  // ---- compress_forward (contract 3.4, 3.5) ---------------------------------------------------
  // Decode when plan_w is None (plan = DecodePlan), prefill otherwise (plan = plan_c).
  // Writes out [N, head_dim] and the state rows the plans address.
  m.def(
      "compress_forward(Tensor(a!) kv_score_buffer, Tensor kv_score_input, Tensor ape, "
      "Tensor plan, Tensor? plan_w, Tensor(b!) out, int head_dim, int compress_ratio, "
      "bool is_online) -> ()");

  // ---- compress_norm_rope_store (contract 4) --------------------------------------------------
  // RMSNorm + RoPE (+ Hadamard for the indexer) + quantised scatter into the paged cache.
  // store_format: "fp8_ds_mla" | "bf16" | "fp8_indexer" | "fp4_indexer".
  m.def(
      "compress_norm_rope_store(Tensor kv, Tensor plan, Tensor norm_weight, Tensor freqs, "
      "Tensor out_loc, Tensor(a!) kvcache, bool is_decode, int compress_ratio, float eps, "
      "int page_size, str store_format) -> ()");
}
