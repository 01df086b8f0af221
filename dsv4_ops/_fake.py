"""Fake (meta) implementations: output shapes and devices of every dsv4 op, so that the ops
trace under torch.compile / torch.export without running a kernel."""
import torch

PLAN_RECORD_BYTES = 16   # DecodePlan, CompressPlan
WRITE_RECORD_BYTES = 8   # WritePlan


def _decode_plan(req_pool_indices):
    return req_pool_indices.new_empty((req_pool_indices.shape[0], PLAN_RECORD_BYTES), dtype=torch.uint8)


def _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, write_bytes):
    plan_c = req_pool_indices.new_empty((num_q_tokens, PLAN_RECORD_BYTES), dtype=torch.uint8)
    plan_w = req_pool_indices.new_empty((num_q_tokens, write_bytes), dtype=torch.uint8)
    counts = seq_lens.new_empty((2,), dtype=torch.int32)
    return plan_c, plan_w, counts


@torch.library.register_fake("dsv4::plan_decode")
def _(req_pool_indices, req_to_token, full_to_state, seq_lens, compress_ratio, swa_page_size,
      ring_size, use_req_ring):
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_decode_legacy")
def _(req_pool_indices, seq_lens, compress_ratio):
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_online_decode")
def _(req_pool_indices, seq_lens, state_slot_offset):
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_prefill")
def _(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, compress_ratio,
      swa_page_size, ring_size, num_q_tokens, use_req_ring):
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, WRITE_RECORD_BYTES)


@torch.library.register_fake("dsv4::plan_prefill_legacy")
def _(req_pool_indices, seq_lens, extend_lens, compress_ratio, num_q_tokens):
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, WRITE_RECORD_BYTES)


@torch.library.register_fake("dsv4::plan_online_prefill")
def _(req_pool_indices, seq_lens, extend_lens, num_q_tokens, state_slot_offset):
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, PLAN_RECORD_BYTES)


@torch.library.register_fake("dsv4::compress_forward")
def _(kv_score_buffer, kv_score_input, ape, plan, plan_w, out, head_dim, compress_ratio, is_online):
    return None


@torch.library.register_fake("dsv4::compress_norm_rope_store")
def _(kv, plan, norm_weight, freqs, out_loc, kvcache, is_decode, compress_ratio, eps, page_size,
      store_format):
    return None
