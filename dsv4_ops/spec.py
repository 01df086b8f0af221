"""Speculative decoding (docs/contract.md 10): the online cr = 128 draft ops with the reference
engine's Python signatures, and the verify widths the offline rings hold.

    from dsv4_ops.spec import (online_c128_mtp_write_prefix_states,
                               online_c128_mtp_mark_pending, online_c128_mtp_commit_pending)

A verify step of D tokens per request (the committed length `seq_lens`, tokens at positions
seq_lens .. seq_lens + D - 1) runs, per step of the engine:

1. at the first forward after a verify, `online_c128_mtp_commit_pending` with the committed
   lengths now (once per online cr = 128 layer), then, for a verify,
   `online_c128_mtp_mark_pending` with this verify's committed lengths;
2. per online layer, `compress_forward` with the online prefill plan of the verify tokens
   (`state_slot_offset` = the bank stride), then `online_c128_mtp_write_prefix_states`.

No op syncs with the host; all are CUDA-graph capturable."""
import torch

from . import ops

__all__ = ["online_c128_mtp_write_prefix_states", "online_c128_mtp_mark_pending",
           "online_c128_mtp_commit_pending", "max_verify_tokens", "ONLINE_TOKEN_FOLD_MAX"]

# compress_forward folds an online segment of at most this many tokens one token at a time, as
# online decode does (contract 3.5): a verify of up to this many tokens per request gives the
# bytes of decoding them (the reference engine verifies up to 8: 7 drafts and the bonus).
ONLINE_TOKEN_FOLD_MAX = 8


def online_c128_mtp_write_prefix_states(kv_score_input: torch.Tensor, seq_lens: torch.Tensor,
                                        req_pool_indices: torch.Tensor,
                                        req_to_token: torch.Tensor, ape: torch.Tensor,
                                        state: torch.Tensor, batch_size: int,
                                        num_verify_tokens: int, state_slot_stride: int, *,
                                        head_dim: int) -> None:
    """Stage the c128 compressor state after each verify token in that token's draft state
    slot: slot req + (step + 1) * state_slot_stride (contract 10.2)."""
    ops.online_c128_mtp_write_prefix_states_op(
        kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state, int(batch_size),
        int(num_verify_tokens), int(state_slot_stride), int(head_dim))


def online_c128_mtp_mark_pending(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                                 pending_seq_lens: torch.Tensor, batch_size: int,
                                 num_req_slots: int, *, head_dim: int,
                                 state_dtype: torch.dtype) -> None:
    """Reset all pending verify lengths, then record `seq_lens` for the requests of this verify
    batch (contract 10.3). `head_dim` and `state_dtype` are the reference engine's kernel
    selectors; the op needs neither."""
    del head_dim, state_dtype
    ops.online_c128_mtp_mark_pending_op(seq_lens, req_pool_indices, pending_seq_lens,
                                        int(batch_size), int(num_req_slots))


def online_c128_mtp_commit_pending(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                                   req_to_token: torch.Tensor, pending_seq_lens: torch.Tensor,
                                   state: torch.Tensor, batch_size: int, num_verify_tokens: int,
                                   state_slot_stride: int, num_req_slots: int, *,
                                   head_dim: int) -> None:
    """Copy the draft state of each request's accepted prefix into its main c128 state slot
    (contract 10.4)."""
    ops.online_c128_mtp_commit_pending_op(
        seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state, int(batch_size),
        int(num_verify_tokens), int(state_slot_stride), int(num_req_slots), int(head_dim))


def max_verify_tokens(compress_ratio: int, ring_size: int) -> int:
    """The most tokens a verify step of one request may carry with an offline compressor whose
    ring holds `ring_size` rows (legacy addressing: the window, 8 or 128), contract 10.1:
    the plan's pad ring - window + 2 where the ring is wider than the window, else 2 for
    cr = 4 (its overlap rows are always written) and 1 for cr = 128."""
    win = 8 if compress_ratio == 4 else 128
    if ring_size > win:
        return ring_size - win + 2
    return 2 if compress_ratio == 4 else 1
