#!/usr/bin/env python3
"""compress_forward benchmarks (docs/contract.md 3.4, 3.5).

Cases, for main hd512 cr4, main hd512 cr128 and indexer hd128 cr4 (fp32 state):
* decode, batch 1/8/64/256/1024, random context lengths ("rand": about 1 request in cr closes
  a window) and all-closing lengths ("bnd": every request pools a window);
* prefill 8x4096, 1x32768, 4x(2000 prefix + 2048) (the last reads state rows);
a bf16-state subset (decode bnd at batch 64 and 1024, prefill 8x4096), and the online cr128
running state (hd512) for the same decode and prefill cases.

Inputs are fp32 kv_score rows (the wkv_gate GEMM output); `out` is preallocated. The
speed-up column times dsv4_ops.testing.reference.compressed_tokens (float64, whole sequences) on the
same number of compressed tokens: decode = one call over that many fresh windows, prefill =
one call per request over its extend rows (the prefix part of 4x(2000+2048) is not
re-pooled). Online decode has no comparable reference workload (None).

    python benchmarks/bench_compress.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C

FAMILY = "compress"


def tag_of(label: str, hd: int, ratio: int, state_dtype: torch.dtype, online: bool = False) -> str:
    return f"{'online' if online else label}{hd}_c{ratio}_{C.dtype_name(state_dtype)}"


def make_world(ctx: C.Context, name: str, hd: int, ratio: int, reqs, state_dtype, online=False,
               input_dtype=torch.float32) -> C.World:
    return C.make_world(ratio=ratio, head_dim=hd, reqs=reqs, device=ctx.device,
                        state_dtype=state_dtype, input_dtype=input_dtype, seed=C.case_seed(name),
                        online=online)


def decode_plan(w: C.World):
    import dsv4_ops

    P = dsv4_ops.CompressorDecodePlan
    if w.is_online:
        return P.generate_online(w.seq_lens, w.rid, w.req_to_token, state_slot_offset=w.state_slot_offset)
    return P.generate(w.compress_ratio, w.rid, w.req_to_token, w.full_to_state, w.seq_lens, C.SWA_PAGE, w.ring,
                      use_req_ring=w.use_req_ring)


def prefill_plan(w: C.World, padded: bool = False):
    """Host-length plan, trimmed to its valid rows; padded: as built for CUDA-graph capture,
    num_q rows with the invalid ones last."""
    import dsv4_ops

    P = dsv4_ops.CompressorPrefillPlan
    if w.is_online:
        return P.generate_online(w.seq_lens_cpu, w.extend_lens_cpu, w.rid, w.req_to_token, w.num_q, use_cuda_graph=padded,
                                 state_slot_offset=w.state_slot_offset)
    return P.generate(w.compress_ratio, w.rid, w.seq_lens_cpu, w.extend_lens_cpu, w.req_to_token, w.full_to_state, C.SWA_PAGE, w.ring,
                      w.num_q, use_cuda_graph=padded, use_req_ring=w.use_req_ring)


def compress_fn(w: C.World, plan, out: torch.Tensor) -> Callable[[], Any]:
    import dsv4_ops

    return lambda: dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, plan, head_dim=w.head_dim,
                                             compress_ratio=w.compress_ratio, out=out, is_online=w.is_online)


def decode_bytes(w: C.World) -> Tuple[int, Dict[str, Any]]:
    if w.is_online:
        k = C.online_decode_counts(w)
        return (C.bytes_online_decode_compress(w, k["n_state_read"], k["n_state_write"],
                                               k["n_close"]),
                {"n_compressed": k["n_close"]})
    n = C.decode_closing(w)
    return C.bytes_decode_compress(w, n), {"n_compressed": n}


def prefill_bytes(w: C.World) -> Tuple[int, Dict[str, Any]]:
    if w.is_online:
        k = C.online_prefill_counts(w)
        return (C.bytes_online_prefill_compress(w, k["n_c"], k["n_w"], k["n_merge"]),
                {"n_compressed": k["n_c"], "n_write": k["n_w"], "n_merge": k["n_merge"]})
    k = C.prefill_counts(w)
    return (C.bytes_prefill_compress(w, k["n_c"], k["state_slots_read"], k["n_w"]),
            {"n_compressed": k["n_c"], "n_write": k["n_w"],
             "state_slots_read": k["state_slots_read"]})


def decode_case(ctx, name, hd, ratio, bs, pattern, state_dtype, online=False,
                input_dtype=torch.float32) -> List[Dict[str, Any]]:
    seqs = C.decode_lengths(bs, pattern, ratio, C.case_seed(name))
    w = make_world(ctx, name, hd, ratio, [(s, 1) for s in seqs], state_dtype, online, input_dtype)
    plan = decode_plan(w)
    out = torch.empty(w.batch_size, hd, dtype=w.input_dtype, device=w.device)
    nbytes, extra = decode_bytes(w)
    ref = None if online else C.ref_pool_fn(ctx, w, extra["n_compressed"], per_request=False)
    return [C.measure(ctx, name, "compress_decode", compress_fn(w, plan, out), nbytes, ref_fn=ref,
                      bs=bs, **extra)]


def prefill_case(ctx, name, hd, ratio, reqs, state_dtype, online=False, padded=False
                 ) -> List[Dict[str, Any]]:
    w = make_world(ctx, name, hd, ratio, reqs, state_dtype, online)
    plan = prefill_plan(w, padded)
    nbytes, extra = prefill_bytes(w)
    n_rows = plan.plan_c.shape[0]
    want = w.num_q if padded else extra["n_compressed"]
    check = "ok" if n_rows == want else f"plan_c rows {n_rows} != {want}"
    out = torch.empty(n_rows, hd, dtype=w.input_dtype, device=w.device)
    nbytes += (n_rows - extra["n_compressed"]) * hd * out.element_size()  # invalid rows: zeros
    ref = C.ref_pool_fn(ctx, w, extra["n_compressed"], per_request=True)
    return [C.measure(ctx, name, "compress_prefill", compress_fn(w, plan, out), nbytes,
                      big=w.num_q >= 4096, ref_fn=ref, bs=w.batch_size, num_q=w.num_q, check=check,
                      **extra)]


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    f32, b16 = torch.float32, torch.bfloat16
    big_bs = ctx.decode_bs()[-1]
    bf16_bs = [b for b in ctx.decode_bs() if b in (64, 1024)] or ctx.decode_bs()[-1:]
    combos = [(lbl, hd, r, False) for lbl, hd, r in C.COMBOS] + [("online", 512, 128, True)]
    for label, hd, r, online in combos:
        for sd in (f32, b16):
            if sd is b16 and online:
                continue
            tag = tag_of(label, hd, r, sd, online)
            for bs in ctx.decode_bs():
                for pat in ("rand", "bnd"):
                    if sd is b16 and (pat != "bnd" or bs not in bf16_bs):
                        continue
                    if ctx.quick and pat == "rand" and bs != big_bs:
                        continue
                    # bf16 states: fp32 input (a mixed-dtype kernel) and bf16 input.
                    for sfx, idt in [("", f32)] + ([("_bf16in", b16)] if sd is b16 else []):
                        name = f"{tag}{sfx}/dec_bs{bs}_{pat}"
                        out.append((name, lambda n=name, hd=hd, r=r, bs=bs, pat=pat, sd=sd,
                                    o=online, i=idt: decode_case(ctx, n, hd, r, bs, pat, sd, o, i)))
            # bf16 states: the first prefill case only. Padded plans (contract 3.4: the invalid
            # rows' zeros count as written) with fp32 states.
            prefills = ctx.prefill_variants(padded=sd is f32)
            for pname, reqs, padded in (prefills[:1] if sd is b16 else prefills):
                name = f"{tag}/{pname}"
                out.append((name, lambda n=name, hd=hd, r=r, q=reqs, sd=sd, o=online, p=padded:
                            prefill_case(ctx, n, hd, r, q, sd, o, padded=p)))
    return out


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
