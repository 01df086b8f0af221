"""Plan classes with the reference engine's API (docs/contract.md 5): named tuples of
(compress_ratio, plan tensors...) built by the planner ops. One planning step per batch
serves every layer."""
from typing import NamedTuple, Optional

import torch

from . import ops
from .spec import max_verify_tokens

_INVALID_COMPRESS_RECORD = (-1, 0, -1, -1)  # as int32 words (contract 3.1)
_INVALID_WRITE_RECORD = (-1, -1)


def _i64(t: torch.Tensor, op: str, arg: str,
         device: Optional[torch.device] = None) -> torch.Tensor:
    if t.dtype == torch.int64 and (device is None or t.device == device):
        return t  # what .to would return, without its dispatch (planning is host-latency bound)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"dsv4.{op}: {arg} must be an integer tensor (int64 or int32), got "
                        f"{t.dtype}")
    return t.to(device=device if device is not None else t.device, dtype=torch.int64)


def _fill_invalid(plan: torch.Tensor, start: int, words) -> None:
    rows = plan[start:].view(torch.int32)
    rows.copy_(torch.tensor(words, dtype=torch.int32, device=plan.device).expand_as(rows))


def _check_copy(op: str, self_plan, other, cls) -> None:
    if not isinstance(other, cls):
        raise TypeError(f"dsv4.{op}: other must be a {cls.__name__}, got {type(other).__name__}")
    if other.compress_ratio != self_plan.compress_ratio:
        raise ValueError(f"dsv4.{op}: other has compress_ratio {other.compress_ratio}, this plan "
                         f"{self_plan.compress_ratio}")


def _copy_rows(op: str, arg: str, dst: torch.Tensor, src: torch.Tensor, invalid_words) -> None:
    """Copy `src` plan rows into `dst` (which may be a longer, padded capture buffer) and mark
    the rows past them invalid."""
    n = src.shape[0]
    if n > dst.shape[0] or src.shape[1:] != dst.shape[1:]:
        raise ValueError(f"dsv4.{op}: other's {arg} is {tuple(src.shape)}, this plan's "
                         f"{tuple(dst.shape)}: it needs at most as many rows, of the same record "
                         f"size")
    dst[:n].copy_(src)
    if n < dst.shape[0]:
        _fill_invalid(dst, n, invalid_words)


class CompressorDecodePlan(NamedTuple):
    compress_ratio: int
    plan_d: torch.Tensor  # DecodePlan [B, 16] uint8

    @property
    def is_decode(self) -> bool:
        return True

    def copy_(self, other: "CompressorDecodePlan") -> None:
        """In-place update (e.g. of a CUDA-graph's static plan) from a freshly built plan of the
        same compress ratio and batch size."""
        op = "CompressorDecodePlan.copy_"
        _check_copy(op, self, other, CompressorDecodePlan)
        if other.plan_d.shape != self.plan_d.shape:
            raise ValueError(f"dsv4.{op}: other has {other.plan_d.shape[0]} batch entries, this "
                             f"plan {self.plan_d.shape[0]} (decode plans copy between equal batch "
                             f"sizes)")
        self.plan_d.copy_(other.plan_d)

    @classmethod
    def generate(cls, compress_ratio: int, req_pool_indices: torch.Tensor,
                 req_to_token: torch.Tensor, full_to_state: torch.Tensor, seq_lens: torch.Tensor,
                 swa_page_size: int, ring_size: int, use_req_ring: bool = False
                 ) -> "CompressorDecodePlan":
        """SWA-paged (cr = 4, use_req_ring False) precondition, checked in debug mode: SWA pages
        are allocated page-aligned (ops.plan_decode). Index tensors must be integer tensors."""
        dev = req_to_token.device
        op = "plan_decode"
        plan = ops.plan_decode(_i64(req_pool_indices, op, "req_pool_indices", dev), req_to_token,
                               full_to_state, _i64(seq_lens, op, "seq_lens", dev), compress_ratio,
                               swa_page_size, ring_size, use_req_ring)
        return cls(compress_ratio, plan)

    @classmethod
    def generate_legacy(cls, compress_ratio: int, req_pool_indices: torch.Tensor,
                        seq_lens: torch.Tensor) -> "CompressorDecodePlan":
        dev = req_pool_indices.device
        op = "plan_decode_legacy"
        return cls(compress_ratio, ops.plan_decode_legacy(
            _i64(req_pool_indices, op, "req_pool_indices"), _i64(seq_lens, op, "seq_lens", dev),
            compress_ratio))

    @classmethod
    def generate_online(cls, seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                        req_to_token: torch.Tensor, state_slot_offset: int = 0
                        ) -> "CompressorDecodePlan":
        dev = req_to_token.device
        op = "plan_online_decode"
        return cls(128, ops.plan_online_decode(_i64(req_pool_indices, op, "req_pool_indices", dev),
                                               _i64(seq_lens, op, "seq_lens", dev),
                                               state_slot_offset))


def _verify_lengths(op: str, compress_ratio: Optional[int], ring_size: Optional[int],
                    seq_lens: torch.Tensor, num_verify_tokens: int, device: torch.device):
    """(seq_lens + D, extend_lens = D, B * D) of a verify step of D tokens per request, on the
    device of seq_lens (no host sync), after the ring check of contract 10.1."""
    d = int(num_verify_tokens)
    if d < 1:
        raise ValueError(f"dsv4.{op}: num_verify_tokens must be at least 1, got {d}")
    if compress_ratio is not None:
        cap = max_verify_tokens(compress_ratio, ring_size)
        if d > cap:
            raise ValueError(
                f"dsv4.{op}: num_verify_tokens {d} is more than a ring of {ring_size} rows holds "
                f"for compress_ratio {compress_ratio} (at most {cap}: a verify token at position "
                f"p overwrites the row of p - {ring_size}, which a later window may still read "
                f"once the token is rejected); a ring of R > window rows holds R - window + 2")
    seq = _i64(seq_lens, op, "seq_lens", device)
    ext = torch.full_like(seq, d)
    return seq + d, ext, int(seq.shape[0]) * d


def _trim(plan_c, plan_w, counts, use_cuda_graph):
    """Trim padded plans to their valid rows when that count is on the host: host lengths,
    no CUDA-graph capture requested and not tracing (contract 3.3)."""
    if use_cuda_graph or not counts.is_cpu or torch.compiler.is_compiling():
        return plan_c, plan_w
    n_c, n_w = counts.tolist()
    return plan_c[:n_c], plan_w[:n_w]


class CompressorPrefillPlan(NamedTuple):
    compress_ratio: int
    plan_c: torch.Tensor  # CompressPlan [Nc, 16] uint8
    plan_w: torch.Tensor  # WritePlan [Nw, 8] uint8 (online: CompressPlan [Nw, 16])
    counts: torch.Tensor  # int32 [2]: valid rows of plan_c and plan_w

    @property
    def is_decode(self) -> bool:
        return False

    def copy_(self, other: "CompressorPrefillPlan") -> None:
        """In-place update of a padded (CUDA-graph) plan; rows past `other`'s are invalid."""
        op = "CompressorPrefillPlan.copy_"
        _check_copy(op, self, other, CompressorPrefillPlan)
        _copy_rows(op, "plan_c", self.plan_c, other.plan_c, _INVALID_COMPRESS_RECORD)
        w_invalid = _INVALID_WRITE_RECORD if self.plan_w.shape[1] == 8 else _INVALID_COMPRESS_RECORD
        _copy_rows(op, "plan_w", self.plan_w, other.plan_w, w_invalid)
        self.counts.copy_(other.counts)

    @classmethod
    def generate(cls, compress_ratio: int, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 extend_lens: torch.Tensor, req_to_token: torch.Tensor,
                 full_to_state: torch.Tensor, swa_page_size: int, ring_size: int,
                 num_q_tokens: int, use_cuda_graph: bool = False, use_req_ring: bool = False
                 ) -> "CompressorPrefillPlan":
        """As CompressorDecodePlan.generate: SWA pages page-aligned (checked in debug mode)."""
        op = "plan_prefill"
        plan_c, plan_w, counts = ops.plan_prefill(
            _i64(req_pool_indices, op, "req_pool_indices", req_to_token.device),
            _i64(seq_lens, op, "seq_lens"), _i64(extend_lens, op, "extend_lens"), req_to_token, full_to_state, compress_ratio, swa_page_size, ring_size,
            int(num_q_tokens), use_req_ring)
        plan_c, plan_w = _trim(plan_c, plan_w, counts, use_cuda_graph)
        return cls(compress_ratio, plan_c, plan_w, counts)

    @classmethod
    def generate_legacy(cls, compress_ratio: int, req_pool_indices: torch.Tensor,
                        seq_lens: torch.Tensor, extend_lens: torch.Tensor, num_q_tokens: int,
                        device, use_cuda_graph: bool = False) -> "CompressorPrefillPlan":
        op = "plan_prefill_legacy"
        plan_c, plan_w, counts = ops.plan_prefill_legacy(
            _i64(req_pool_indices, op, "req_pool_indices", torch.device(device)),
            _i64(seq_lens, op, "seq_lens"), _i64(extend_lens, op, "extend_lens"),
            compress_ratio, int(num_q_tokens))
        plan_c, plan_w = _trim(plan_c, plan_w, counts, use_cuda_graph)
        return cls(compress_ratio, plan_c, plan_w, counts)

    @classmethod
    def generate_online(cls, seq_lens: torch.Tensor, extend_lens: torch.Tensor,
                        req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                        num_q_tokens: int, use_cuda_graph: bool = False,
                        state_slot_offset: int = 0) -> "CompressorPrefillPlan":
        op = "plan_online_prefill"
        plan_c, plan_w, counts = ops.plan_online_prefill(
            _i64(req_pool_indices, op, "req_pool_indices", req_to_token.device),
            _i64(seq_lens, op, "seq_lens"), _i64(extend_lens, op, "extend_lens"),
            int(num_q_tokens), state_slot_offset)
        plan_c, plan_w = _trim(plan_c, plan_w, counts, use_cuda_graph)
        return cls(128, plan_c, plan_w, counts)

    # ---- verify steps (contract 10.1): D tokens per request after the committed seq_lens ------

    @classmethod
    def generate_verify(cls, compress_ratio: int, req_pool_indices: torch.Tensor,
                        seq_lens: torch.Tensor, num_verify_tokens: int,
                        req_to_token: torch.Tensor, full_to_state: torch.Tensor,
                        swa_page_size: int, ring_size: int, use_cuda_graph: bool = True,
                        use_req_ring: bool = False) -> "CompressorPrefillPlan":
        """The prefill plan of a verify step (extend = num_verify_tokens for every request,
        `seq_lens` the committed lengths). Raises if the ring cannot hold that many verify
        tokens (dsv4_ops.spec.max_verify_tokens)."""
        op = "CompressorPrefillPlan.generate_verify"
        seq, ext, nq = _verify_lengths(op, compress_ratio, ring_size, seq_lens,
                                       num_verify_tokens, req_to_token.device)
        return cls.generate(compress_ratio, req_pool_indices, seq, ext, req_to_token,
                            full_to_state, swa_page_size, ring_size, nq, use_cuda_graph,
                            use_req_ring)

    @classmethod
    def generate_verify_legacy(cls, compress_ratio: int, req_pool_indices: torch.Tensor,
                               seq_lens: torch.Tensor, num_verify_tokens: int, device,
                               use_cuda_graph: bool = True) -> "CompressorPrefillPlan":
        """As generate_verify with legacy slots (a ring of one window)."""
        op = "CompressorPrefillPlan.generate_verify_legacy"
        seq, ext, nq = _verify_lengths(op, compress_ratio, 8 if compress_ratio == 4 else 128,
                                       seq_lens, num_verify_tokens, torch.device(device))
        return cls.generate_legacy(compress_ratio, req_pool_indices, seq, ext, nq, device,
                                   use_cuda_graph)

    @classmethod
    def generate_online_verify(cls, seq_lens: torch.Tensor, num_verify_tokens: int,
                               req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                               use_cuda_graph: bool = True,
                               state_slot_offset: int = 0) -> "CompressorPrefillPlan":
        """The online prefill plan of a verify step; `state_slot_offset` is the bank stride of
        the staging ops (contract 10.2): the trailing segment lands in bank 1, which
        online_c128_mtp_write_prefix_states then overwrites with the per-token states."""
        op = "CompressorPrefillPlan.generate_online_verify"
        seq, ext, nq = _verify_lengths(op, None, None, seq_lens, num_verify_tokens,
                                       req_to_token.device)
        return cls.generate_online(seq, ext, req_pool_indices, req_to_token, nq, use_cuda_graph,
                                   state_slot_offset)
