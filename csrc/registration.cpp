// The one registration block: every dsv4 operator schema. Kernels register their CPU and
// CUDA/HIP implementations next to their code (csrc/<family>/*_cpu.cpp, *_cuda.cu); the fake
// (meta) implementations live in dsv4_ops/_fake.py.
//
// Conventions: plan tensors are uint8 [N, record_bytes] (docs/contract.md 3.1); mutated arguments are
// annotated (a!) and the ops that mutate return nothing (destination passing), so no op
// returns an alias of an input. Every store ends in dcp_world_size W, dcp_rank, dcp_interleave I
// (contract 9): a rank writes only the cache entries it owns, each at its local slot; W = 1 is
// the single-rank store.
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

  // ---- context-parallel prefill (contract 8) --------------------------------------------------
  // This rank's online-softmax partials m | s | k [3, W, head_dim] of the W windows of the
  // batch's plan_c, over the rows it holds (input_rows [Q]: local row of each ragged row, -1
  // elsewhere; the state rows only with read_state), and persist_rows: the plan_w rows it holds.
  m.def(
      "compress_partials(Tensor kv_score_buffer, Tensor kv_score_input, Tensor input_rows, "
      "Tensor ape, Tensor plan_c, Tensor plan_w, Tensor(a!) partials, Tensor(b!) persist_rows, "
      "int head_dim, int compress_ratio, bool read_state) -> ()");
  // Merge the partials [R, 3, W, head_dim] of R ranks (and a bare max max_m [W, head_dim]) into
  // the compressed rows out [W, head_dim] or into one partial out [3, W, head_dim].
  m.def("merge_partials(Tensor partials, Tensor? max_m, Tensor(a!) out) -> ()");

  // ---- speculative decoding with the online cr=128 state (contract 10) ------------------------
  // Fold the num_verify_tokens rows of each request (row b*D + step) into its committed state
  // (slot req) and stage the state after token step at slot req + (step+1)*state_slot_stride.
  m.def(
      "online_c128_mtp_write_prefix_states(Tensor kv_score_input, Tensor seq_lens, "
      "Tensor req_pool_indices, Tensor req_to_token, Tensor ape, Tensor(a!) state, "
      "int batch_size, int num_verify_tokens, int state_slot_stride, int head_dim) -> ()");
  // pending_seq_lens[:num_req_slots] = -1, then pending_seq_lens[req[b]] = seq_lens[b].
  m.def(
      "online_c128_mtp_mark_pending(Tensor seq_lens, Tensor req_pool_indices, "
      "Tensor(a!) pending_seq_lens, int batch_size, int num_req_slots) -> ()");
  // Copy the bank of each request's accepted prefix (seq_lens - pending, clamped to
  // [0, num_verify_tokens]) into its main slot.
  m.def(
      "online_c128_mtp_commit_pending(Tensor seq_lens, Tensor req_pool_indices, "
      "Tensor req_to_token, Tensor pending_seq_lens, Tensor(a!) state, int batch_size, "
      "int num_verify_tokens, int state_slot_stride, int num_req_slots, int head_dim) -> ()");

  // ---- compress_norm_rope_store (contract 4) --------------------------------------------------
  // RMSNorm + RoPE (+ Hadamard for the indexer) + quantised scatter into the paged cache.
  // store_format: "fp8_ds_mla" | "bf16" | "fp8_indexer" | "fp4_indexer"; layout: the cache
  // layout of fp8_ds_mla (non-v4 layouts: contract V4.1 4.2).
  m.def(
      "compress_norm_rope_store(Tensor kv, Tensor plan, Tensor norm_weight, Tensor freqs, "
      "Tensor out_loc, Tensor(a!) kvcache, bool is_decode, int compress_ratio, float eps, "
      "int page_size, str store_format, str layout=\"v4\", int dcp_world_size=1, "
      "int dcp_rank=0, int dcp_interleave=1) -> ()");

  // ---- compress_and_store (contract 11) --------------------------------------------------------
  // compress_forward then compress_norm_rope_store of its rows, in one call: decode when plan_w
  // is None. out (the pooled rows) is optional; without it the rows live only inside the call,
  // as kv_score_input's dtype. Arguments and bytes are those of the pair.
  m.def(
      "compress_and_store(Tensor(a!) kv_score_buffer, Tensor kv_score_input, Tensor ape, "
      "Tensor plan, Tensor? plan_w, Tensor norm_weight, Tensor freqs, Tensor out_loc, "
      "Tensor(b!) kvcache, Tensor(c!)? out, int head_dim, int compress_ratio, bool is_online, "
      "float eps, int page_size, str store_format, str layout=\"v4\", int dcp_world_size=1, "
      "int dcp_rank=0, int dcp_interleave=1) -> ()");

  // ---- V4.1 ratio-1 / ratio-2 compressors and stores (contract V4.1 1 - 3) --------------------
  // layout: "v4" | "v41" | "v41_fp4" | "uniform_fp8" | "v41_new" | "v41_fp4_new".
  // Ratio 1: RMSNorm of every bf16 kv row into latent; RoPE + quantised store where out_loc > 0.
  m.def(
      "c1_norm_rope_store(Tensor kv, Tensor norm_weight, float eps, Tensor freqs, "
      "Tensor positions, Tensor out_loc, Tensor(a!) kvcache, int page_size, str layout, "
      "Tensor(b!) latent, int dcp_world_size=1, int dcp_rank=0, int dcp_interleave=1) -> ()");
  // Ratio 2, decode (draft_len 1) and verify (draft_len > 1): even rows park in the pair-state
  // ring, odd rows pool with their partner, write their latent and store at raw_out_loc >> 1.
  m.def(
      "c2_norm_rope_store(Tensor kv_score, Tensor(a!) state, Tensor norm_weight, float eps, "
      "Tensor freqs, Tensor positions, Tensor req, Tensor raw_out_loc, Tensor(b!) kvcache, "
      "int page_size, int ring_size, int draft_len, str layout, Tensor(c!) latent, "
      "int dcp_world_size=1, int dcp_rank=0, int dcp_interleave=1) -> ()");
  // Ratio 2, extend: in-batch partners, then each request's last min(len, ring) rows parked.
  m.def(
      "c2_prefill_norm_rope_store(Tensor kv_score, Tensor(a!) state, Tensor norm_weight, "
      "float eps, Tensor freqs, Tensor positions, Tensor req, Tensor raw_out_loc, "
      "Tensor extend_start_loc, Tensor extend_seq_lens, Tensor(b!) kvcache, int page_size, "
      "int ring_size, str layout, Tensor(c!) latent, int dcp_world_size=1, int dcp_rank=0, "
      "int dcp_interleave=1) -> ()");
  // Low-ratio index-K: RMSNorm + RoPE at the group position + two-stage fp4 into the
  // fp4_indexer page (68 bytes a slot) where loc > 0.
  m.def(
      "low_ratio_index_k_store(Tensor k, Tensor norm_weight, float eps, Tensor freqs, "
      "Tensor positions, Tensor loc, Tensor(a!) cache, int page_size, int ratio, "
      "int dcp_world_size=1, int dcp_rank=0, int dcp_interleave=1) -> ()");
  // Plain store of 512-dim rows into a layout (optional RoPE by per-row freqs, V41 family).
  m.def(
      "kv_store(Tensor x, Tensor loc, Tensor? freqs_rows, Tensor(a!) kvcache, int page_size, "
      "str layout, int dcp_world_size=1, int dcp_rank=0, int dcp_interleave=1) -> ()");
}
