#!/usr/bin/env python3
"""Context-parallel prefill ops (docs/contract.md 8): compress_partials and merge_partials on one
device, as one rank of a group of 2 or 4 runs them.

Cases: main hd512 cr4, main hd512 cr128 and indexer hd128 cr4 (fp32 state and input) on the
prefill cases of compress_forward (benchmarks/bench_compress.py; p4x2000+2048 reads state rows),
the batch's ragged rows dealt to the ranks in blocks of 128, round-robin; rank 0 (the one that
reads the state) is timed. Rows per case:
* cp_partials      compress_partials of rank 0: its rows, the state rows its windows read,
                   written: the partials [3, W, hd] of every window and the persisted rows;
* cp_merge_rebase  merge_partials of rank 0's partial against the group's max (max_m) into a
                   partial: cp_compress's step between its two all-reduces;
* cp_merge_rows    merge_partials of the summed partial into the compressed rows: its last step;
* cp_merge_stack   merge_partials of all the ranks' partials [R, 3, W, hd] into rows (the
                   all-gathered-partials alternative).
Bytes: every input row, state row, partial, max and output read or written once; plan records
and input_rows counted (16 / 8 / 4 bytes). check (cp_partials rows): the ranks' partials merged
equal compress_forward's rows within 1e-6.

Decode-context-parallel stores (contract 9), rank 0 of W = 4 against W = 1 (interleave 1), its
cache dsv4_ops.dcp_local_pages pages:
* dcp_store_w<W>   compress_norm_rope_store, fp8_ds_mla main hd512 cr4: decode batch 64 and
                   1024 (every request closing a window) and prefill 8x4096;
* dcp_c1_w<W>      c1_norm_rope_store (V4.1 ratio 1, layout v41_fp4): 64, 1024 and 32768 rows.
Bytes: the rows and RoPE rows of the tokens the rank stores, out_loc and plan records of every
row (c1: every row's input and latent, replicated), the cache bytes written (bytes_written:
data and scales of the rank's slots). check: the rank's cache holds data in exactly the slots
it owns.

    python benchmarks/bench_cp.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks.bench_compress import decode_plan, prefill_plan

FAMILY = "cp"
RANKS = (2, 4)


def _shares(num_q: int, ranks: int, device) -> List[torch.Tensor]:
    q = torch.arange(num_q, device=device)
    return [q[(q // 128) % ranks == r] for r in range(ranks)]


def _check(w, plan, partials, hd) -> str:
    """The ranks' partials merged against compress_forward's rows."""
    import dsv4_ops

    want = torch.empty((plan.plan_c.shape[0], hd), device=w.device)
    dsv4_ops.compress_forward(w.state.clone(), w.kv_in, w.ape, plan, head_dim=hd,
                              compress_ratio=w.compress_ratio, out=want)
    got = torch.empty_like(want)
    dsv4_ops.ops.merge_partials_op(partials, None, got)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    return "ok" if err <= 1e-6 * max(1.0, float(want.abs().max())) else f"max error {err:.2e}"


def case_rows(ctx: C.Context, name: str, hd: int, ratio: int, reqs, ranks: int
              ) -> List[Dict[str, Any]]:
    import dsv4_ops
    from dsv4_ops.distributed import ContextParallelPlan

    w = C.make_world(ratio=ratio, head_dim=hd, reqs=reqs, device=ctx.device,
                     seed=C.case_seed(name))
    plan = prefill_plan(w)
    windows, persisted = plan.plan_c.shape[0], plan.plan_w.shape[0]
    shares = _shares(w.num_q, ranks, w.device)
    cps = [ContextParallelPlan.generate(plan, s, w.num_q, read_state=r == 0)
           for r, s in enumerate(shares)]
    rows = [w.kv_in[s].contiguous() for s in shares]
    partials = torch.empty((ranks, 3, windows, hd), device=w.device)
    persist = w.kv_in.new_empty((persisted, w.kv_in.shape[1]))

    def partials_fn(r: int) -> Callable[[], Any]:
        return lambda: dsv4_ops.ops.compress_partials_op(
            w.state, rows[r], cps[r].input_rows, w.ape, cps[r].plan_c, cps[r].plan_w,
            partials[r], persist, hd, ratio, cps[r].read_state)

    for r in range(ranks):
        partials_fn(r)()
    ctx.timer.sync()
    check = _check(w, plan, partials, hd)
    max_m = partials[:, 0].amax(0)
    rebased = torch.empty((3, windows, hd), device=w.device)
    out = torch.empty((windows, hd), device=w.device)
    plane = windows * hd * 4
    es = w.kv_in.element_size()
    row_bytes = w.kv_in.shape[1] * es
    k = C.prefill_counts(w)
    mine = shares[0].shape[0]
    # rank 0's bytes: its rows, the state rows (all windows' state rows: it reads the state),
    # ape, plan_c, plan_w, input_rows; written: three planes and the persisted rows.
    b_partials = (mine * row_bytes + k["state_slots_read"] * 2 * hd * C.esize(w.state_dtype)
                  + w.ape.numel() * 4 + windows * 16 + persisted * 8 + w.num_q * 4
                  + 3 * plane + persisted * row_bytes)
    extra = dict(ranks=ranks, windows=windows, persisted=persisted, num_q=w.num_q,
                 rank_rows=mine, bs=w.batch_size)
    big = w.num_q >= 4096
    out_rows = [C.measure(ctx, name, "cp_partials", partials_fn(0), b_partials, big=big,
                          check=check, **extra)]
    merges = [("cp_merge_rebase", partials[:1], max_m, rebased, 3 * plane + plane + 3 * plane),
              ("cp_merge_rows", partials[:1], None, out, 3 * plane + plane),
              ("cp_merge_stack", partials, None, out, ranks * 3 * plane + plane)]
    for op, p, m, o, nbytes in merges:
        out_rows.append(C.measure(
            ctx, name, op, lambda p=p, m=m, o=o: dsv4_ops.ops.merge_partials_op(p, m, o),
            nbytes, big=big, **extra))
    return out_rows


DCP_WORLDS = (1, 4)
DCP_DECODE_BS = (64, 1024)


def _owned(slots: torch.Tensor, world_size: int) -> int:
    """Global entries among `slots` (>= 0) that rank 0 of world_size owns."""
    import dsv4_ops

    return int((dsv4_ops.dcp_local_slot(slots, world_size, 0, 1) >= 0).sum())


def dcp_store_rows(ctx: C.Context, name: str, reqs, decode: bool, world_size: int
                   ) -> List[Dict[str, Any]]:
    """compress_norm_rope_store (fp8_ds_mla, hd512 cr4) as rank 0 of world_size."""
    import dsv4_ops

    fmt, hd = "fp8_ds_mla", 512
    w = C.make_world(ratio=4, head_dim=hd, reqs=reqs, device=ctx.device, seed=C.case_seed(name),
                     fill=False)
    plan = decode_plan(w) if decode else prefill_plan(w)
    n_rows = plan[1].shape[0]
    kv = torch.randn(n_rows, hd, device=w.device,
                     generator=torch.Generator(device=w.device).manual_seed(7))
    ps = w.cache_page_size
    cache = w.kvcache(fmt, pages=dsv4_ops.dcp_local_pages(w.num_pages, ps, world_size))
    stored = w.out_loc_cpu[w.out_loc_cpu >= 0]
    mine = _owned(stored, world_size)

    def fn():
        dsv4_ops.compress_norm_rope_store(
            kv, plan, norm_weight=w.norm_weight, norm_eps=C.NORM_EPS, freq_cis=w.freqs,
            out_loc=w.out_loc, kvcache=cache, page_size=ps, dcp_world_size=world_size,
            dcp_rank=0)

    fn()
    got = C.slots_with_data(cache, ps, dsv4_ops.STORE_FORMATS[fmt].data_bytes)
    check = "ok" if got == mine else f"slots written {got} != {mine}"
    nbytes = C.bytes_store(w, mine, n_rows, fmt) + (stored.numel() - mine) * 8
    return [C.measure(ctx, name, f"dcp_store_w{world_size}", fn, nbytes, big=not decode,
                      check=check, dcp_world_size=world_size, stored=stored.numel(),
                      rank_stored=mine, bytes_written=mine * C.store_token_bytes(fmt),
                      bs=w.batch_size)]


def dcp_c1_rows(ctx: C.Context, name: str, n: int, world_size: int) -> List[Dict[str, Any]]:
    """c1_norm_rope_store (v41_fp4) of n rows, each storing, as rank 0 of world_size."""
    import dsv4_ops
    from dsv4_ops import KVLayout

    layout, ps, hd = KVLayout.V41_FP4, 64, 512
    dev = ctx.device
    g = torch.Generator(device=dev).manual_seed(C.case_seed(name))
    kv = torch.randn(n, hd, device=dev, generator=g).to(torch.bfloat16)
    norm_w = (1.0 + 0.1 * torch.randn(hd, device=dev, generator=g)).to(torch.bfloat16)
    freqs = torch.rand(n, 64, device=dev, generator=g)
    positions = torch.arange(n, device=dev)
    pages = -(-(n + 1) // ps)
    out_loc = torch.randperm(pages * ps - 1, device=dev, generator=g)[:n] + 1
    cache = torch.zeros((dsv4_ops.dcp_local_pages(pages, ps, world_size),
                         layout.page_bytes(ps)), dtype=torch.uint8, device=dev)
    latent = torch.empty((n, hd), dtype=torch.bfloat16, device=dev)
    mine = _owned(out_loc.cpu(), world_size)

    def fn():
        dsv4_ops.c1_decode_norm_rope_store(kv, norm_w, positions, out_loc, C.NORM_EPS, freqs,
                                           cache, page_size=ps, layout=layout, out=latent,
                                           dcp_world_size=world_size, dcp_rank=0)

    fn()
    got = C.slots_with_data(cache, ps, layout.data_bytes)
    check = "ok" if got == mine else f"slots written {got} != {mine}"
    written = mine * layout.bytes_per_token
    nbytes = n * (2 * hd * 2 + 16) + hd * 2 + mine * 64 * 4 + written
    return [C.measure(ctx, name, f"dcp_c1_w{world_size}", fn, nbytes, big=n >= 4096,
                      check=check, dcp_world_size=world_size, stored=n, rank_stored=mine,
                      bytes_written=written)]


def dcp_cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    bss = ctx.decode_bs()[-1:] if ctx.smoke else DCP_DECODE_BS
    pname, preqs = ctx.prefill_cases()[0]
    for ws in DCP_WORLDS:
        for bs in bss:
            name = f"dcp_fp8_ds_mla_c4/dec_bs{bs}_bnd_w{ws}"
            seqs = C.decode_lengths(bs, "bnd", 4, C.case_seed(name))
            out.append((name, lambda n=name, q=[(s, 1) for s in seqs], k=ws:
                        dcp_store_rows(ctx, n, q, True, k)))
        name = f"dcp_fp8_ds_mla_c4/{pname}_w{ws}"
        out.append((name, lambda n=name, q=preqs, k=ws: dcp_store_rows(ctx, n, q, False, k)))
        for rows_n in (*bss, sum(e for _, e in preqs)):
            name = f"dcp_c1_v41_fp4/rows{rows_n}_w{ws}"
            out.append((name, lambda n=name, r=rows_n, k=ws: dcp_c1_rows(ctx, n, r, k)))
    return out


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = dcp_cases(ctx)
    for label, hd, r in C.COMBOS:
        for pname, reqs in ctx.prefill_cases():
            for ranks in RANKS:
                name = f"{label}{hd}_c{r}/{pname}_cp{ranks}"
                out.append((name, lambda n=name, hd=hd, r=r, q=reqs, k=ranks:
                            case_rows(ctx, n, hd, r, q, k)))
    return out


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
