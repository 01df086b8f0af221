"""Context-parallel prefill over torch.distributed (docs/contract.md 8).

The ranks of a context-parallel group split one prefill batch's tokens: each holds the kv_score
rows of some of the batch's ragged rows. Instead of all-gathering those rows, each rank pools
the rows it holds into per-window online-softmax partials (compress_partials), the group merges
them with two all-reduces, and every rank ends with the compressed rows and the state buffer
that compress_forward gives on the whole batch:

    plan = dsv4_ops.CompressorPrefillPlan.generate(...)          # the whole batch, every rank
    cp = ContextParallelPlan.generate(plan, token_rows, num_q_tokens)   # once per batch
    kv = cp_compress(state, my_rows, ape, cp, head_dim=512, compress_ratio=128)  # per layer

Standard collectives only (all_reduce MAX, then SUM), on fixed-shape contiguous tensors, and no
host sync: it runs on gloo and NCCL and captures in a CUDA graph with NCCL.
"""
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from . import ops
from .plans import CompressorPrefillPlan


def window_bound(num_q_tokens: int, batch_size: int, compress_ratio: int) -> int:
    """The most windows a prefill batch of num_q_tokens ragged rows over batch_size requests
    closes: a bound for the rows of a padded (CUDA-graph) plan_c that can be valid (the valid
    rows come first, contract 3.3)."""
    return min(num_q_tokens, num_q_tokens // compress_ratio + batch_size)


class ContextParallelPlan(NamedTuple):
    """One rank's view of a prefill batch for cp_compress (contract 8), made once per batch and
    used by every layer. plan_c / plan_w are the batch's plan (the same on every rank)."""
    compress_ratio: int
    plan_c: torch.Tensor        # CompressPlan [W, 16]: the batch's windows
    plan_w: torch.Tensor        # WritePlan [Nw, 8]: the batch's rows to persist
    input_rows: torch.Tensor    # int32 [num_q_tokens]: this rank's row of each ragged row, or -1
    persist_plan: torch.Tensor  # WritePlan [Nw, 8]: plan_w re-based to the exchanged rows
    read_state: bool            # this rank folds the state rows (one rank of the group)

    @classmethod
    def generate(cls, plan: CompressorPrefillPlan, token_rows: torch.Tensor, num_q_tokens: int,
                 *, read_state: Optional[bool] = None, group=None,
                 max_windows: Optional[int] = None, max_persist: Optional[int] = None
                 ) -> "ContextParallelPlan":
        """plan: the batch's CompressorPrefillPlan (plan_prefill or plan_prefill_legacy, not
        online), the same on every rank; token_rows: int64 [T] on plan's device, the ragged row
        (0 .. num_q_tokens - 1) of each of this rank's kv_score rows, in their order. The ranks'
        token_rows partition the batch's ragged rows. read_state: whether this rank folds the
        state rows (default: rank 0 of `group`, or True without a process group).
        max_windows / max_persist: keep only the first rows of a padded (CUDA-graph) plan_c /
        plan_w (window_bound; the valid records come first), so that the exchange does not
        carry the padding. Device ops only, no host sync."""
        if not isinstance(plan, CompressorPrefillPlan) or plan.plan_w.shape[-1] != 8:
            raise TypeError("dsv4.ContextParallelPlan.generate: plan must be an offline "
                            "CompressorPrefillPlan (generate or generate_legacy), got "
                            f"{type(plan).__name__}")
        if read_state is None:
            read_state = (not dist.is_available() or not dist.is_initialized()
                          or dist.get_rank(group) == 0)
        plan_c = plan.plan_c[:max_windows] if max_windows is not None else plan.plan_c
        plan_w = plan.plan_w[:max_persist] if max_persist is not None else plan.plan_w
        dev = plan_c.device
        rows = token_rows.to(device=dev, dtype=torch.int64)
        input_rows = torch.full((int(num_q_tokens),), -1, dtype=torch.int32, device=dev)
        input_rows[rows] = torch.arange(rows.shape[0], dtype=torch.int32, device=dev)
        return cls(plan.compress_ratio, plan_c, plan_w, input_rows,
                   _persist_plan(plan_w, int(num_q_tokens)), bool(read_state))

    def exchanged_bytes(self, head_dim: int, element_size: int) -> int:
        """Bytes of the tensors one rank all-reduces per cp_compress call: m, then s | k (fp32
        [W, head_dim] each), then the persisted rows (element_size bytes per kv_score value)."""
        row = head_dim * (4 if self.compress_ratio == 4 else 2)
        return 3 * self.plan_c.shape[0] * head_dim * 4 + self.plan_w.shape[0] * row * element_size


def _persist_plan(plan_w: torch.Tensor, num_q_tokens: int) -> torch.Tensor:
    """plan_w with ragged_id k in record k (row k of the exchanged persist_rows); records
    without a row of the batch become invalid, as compress_forward skips them."""
    words = plan_w.contiguous().view(torch.int32)
    ragged, slot = words[:, 0], words[:, 1]
    valid = (ragged >= 0) & (ragged < num_q_tokens)  # invalid records hold 0xFFFFFFFF
    k = torch.arange(words.shape[0], dtype=torch.int32, device=words.device)
    none = torch.full_like(k, -1)
    return torch.stack([torch.where(valid, k, none), torch.where(valid, slot, none)],
                       dim=1).view(torch.uint8)


def cp_compress(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor, ape: torch.Tensor,
                plan: ContextParallelPlan, *, head_dim: int, compress_ratio: int, group=None,
                out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """compress_forward of the whole batch, on every rank of `group`, from this rank's rows.

    kv_score_input: this rank's kv_score rows (plan.input_rows says which ragged rows they are);
    kv_score_buffer: the state buffer, the same on every rank before the call and after it.
    Returns out [W, head_dim] (default: kv_score_input's dtype): the compressed rows of the
    batch's plan_c, on every rank, within fp32 rounding of compress_forward's; the state rows
    plan_w persists are written on every rank, bit for bit as compress_forward writes them.

    The exchange: all_reduce(MAX) of m, all_reduce(SUM) of s | k rebased to that max, and
    all_reduce(SUM) of the persisted rows (as int32: each rank adds its rows' bits to zeros)."""
    if plan.compress_ratio != compress_ratio:
        raise ValueError(f"dsv4.cp_compress: compress_ratio={compress_ratio} but the plan was "
                         f"built for {plan.compress_ratio}")
    windows, persisted = plan.plan_c.shape[0], plan.plan_w.shape[0]
    dev = kv_score_input.device
    partials = torch.empty((1, 3, windows, head_dim), dtype=torch.float32, device=dev)
    persist = kv_score_input.new_empty((persisted, kv_score_input.shape[1]))
    ops.compress_partials_op(kv_score_buffer, kv_score_input, plan.input_rows, ape, plan.plan_c,
                             plan.plan_w, partials[0], persist, head_dim, compress_ratio,
                             plan.read_state)
    if out is None:
        out = kv_score_input.new_empty((windows, head_dim))
    if windows:
        max_m = partials[0, 0].clone()
        dist.all_reduce(max_m, op=dist.ReduceOp.MAX, group=group)
        rebased = torch.empty_like(partials)
        ops.merge_partials_op(partials, max_m, rebased[0])
        dist.all_reduce(rebased[0, 1:], op=dist.ReduceOp.SUM, group=group)
        ops.merge_partials_op(rebased, None, out)
    if persisted:
        dist.all_reduce(persist.view(torch.int32), op=dist.ReduceOp.SUM, group=group)
    ops.compress_forward_op(kv_score_buffer, persist, ape, plan.plan_c[:0], plan.persist_plan,
                            out[:0], head_dim, compress_ratio, False)
    return out
