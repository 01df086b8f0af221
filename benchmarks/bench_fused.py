#!/usr/bin/env python3
"""compress_and_store (docs/contract.md 11) against the unfused pair it replaces.

decode: B requests (1, 8, 64, 256, 1024; --quick 8 and 1024) of each decode kernel (c4 main
  hd512 fp8_ds_mla, c4 indexer hd128 fp4_indexer, c128 main offline, c128 main online), in a
  step that closes every request's window ("bnd") and in one that closes none ("open"):
  `fused_decode` (compress_and_store without `out`) and `pair_decode` (compress_forward into a
  preallocated `out`, then compress_norm_rope_store), cold and under CUDA-graph replay; the
  fused row's `vs_pair` / `vs_pair_graph` are its time over the pair's.
prefill: the first prefill case (8x4096) of c4 main and c128 main, padded plan:
  `fused_prefill` (compress_and_store with `out`), `fused_prefill_no_out` (without it),
  `pair_prefill` and `compress_prefill` (compress_forward alone); `vs_compress` is a fused
  row's time over compress_forward alone.
check: the fused call leaves the pair's state rows and cache bytes (and `out`).

    python benchmarks/bench_fused.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks.bench_compress import decode_bytes, decode_plan, prefill_bytes, prefill_plan

FAMILY = "fused"
# (label, head_dim, ratio, store format, online)
DECODE_KERNELS = [("main512_c4", 512, 4, "fp8_ds_mla", False),
                  ("indexer128_c4", 128, 4, "fp4_indexer", False),
                  ("main512_c128", 512, 128, "fp8_ds_mla", False),
                  ("online512_c128", 512, 128, "fp8_ds_mla", True)]
PREFILL_KERNELS = [("main512_c4", 512, 4, "fp8_ds_mla"), ("main512_c128", 512, 128, "fp8_ds_mla")]


def _fns(w: C.World, plan, fmt: str, out: Optional[torch.Tensor], pair_out: torch.Tensor,
         state: torch.Tensor, cache: torch.Tensor) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """(fused, pair) calls of one step on `state` and `cache`."""
    import dsv4_ops

    hd, cr = w.head_dim, w.compress_ratio
    store = dict(norm_weight=w.norm_weight, norm_eps=C.NORM_EPS, freq_cis=w.freqs,
                 out_loc=w.out_loc, kvcache=cache, page_size=w.cache_page_size,
                 **C.store_flags(fmt))

    def fused():
        dsv4_ops.compress_and_store(state, w.kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr,
                                    is_online=w.is_online, out=out, **store)

    def pair():
        dsv4_ops.compress_forward(state, w.kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr,
                                  out=pair_out, is_online=w.is_online)
        dsv4_ops.compress_norm_rope_store(pair_out, plan, **store)

    return fused, pair


def _check(w: C.World, plan, fmt: str, with_out: bool) -> str:
    """One fused and one pair call on copies of the state and of a zeroed cache: 'ok' when the
    state rows, the cache bytes and `out` are the same."""
    rows = plan[1].shape[0]
    results = []
    for fused in (True, False):
        state, cache = w.state.clone(), w.kvcache(fmt, pages=w.num_pages)
        pair_out = torch.empty(rows, w.head_dim, dtype=w.input_dtype, device=w.device)
        out = torch.empty_like(pair_out) if with_out else None
        f, p = _fns(w, plan, fmt, out, pair_out, state, cache)
        (f if fused else p)()
        results.append((state, cache, out if fused else (pair_out if with_out else None)))
    (s0, c0, o0), (s1, c1, o1) = results
    if not torch.equal(s0, s1):
        return "state rows differ from the pair's"
    if not torch.equal(c0, c1):
        return "cache bytes differ from the pair's"
    if with_out and not torch.equal(o0, o1):
        return "out differs from the pair's"
    return "ok"


def _ratio(a: Dict[str, Any], b: Dict[str, Any], key: str) -> Optional[float]:
    return a[key] / b[key] if a.get(key) and b.get(key) else None


def _decode_case(ctx: C.Context, name: str, hd: int, cr: int, fmt: str, online: bool, bs: int,
                 pattern: str) -> List[Dict[str, Any]]:
    seqs = C.decode_lengths(bs, pattern, cr, C.case_seed(name))
    w = C.make_world(ratio=cr, head_dim=hd, reqs=[(s, 1) for s in seqs], device=ctx.device,
                     seed=C.case_seed(name), online=online)
    plan = decode_plan(w)
    check = _check(w, plan, fmt, with_out=False)
    cache = w.kvcache(fmt)
    pair_out = torch.empty(bs, hd, dtype=w.input_dtype, device=w.device)
    fused, pair = _fns(w, plan, fmt, None, pair_out, w.state, cache)
    nb_c, extra = decode_bytes(w)
    nbytes = nb_c + C.bytes_store(w, extra["n_compressed"], bs, fmt)
    common = dict(bs=bs, store_format=fmt, **extra)
    f = C.measure(ctx, name, "fused_decode", fused, nbytes, check=check, **common)
    p = C.measure(ctx, name, "pair_decode", pair, nbytes, **common)
    f["vs_pair"], f["vs_pair_graph"] = _ratio(f, p, "time_us"), _ratio(f, p, "graph_us")
    return [f, p]


def _prefill_case(ctx: C.Context, name: str, hd: int, cr: int, fmt: str,
                  reqs: List[Tuple[int, int]]) -> List[Dict[str, Any]]:
    import dsv4_ops

    w = C.make_world(ratio=cr, head_dim=hd, reqs=reqs, device=ctx.device,
                     seed=C.case_seed(name))
    plan = prefill_plan(w, padded=True)
    check = _check(w, plan, fmt, with_out=True)
    rows = plan[1].shape[0]
    cache = w.kvcache(fmt)
    out = torch.empty(rows, hd, dtype=w.input_dtype, device=w.device)
    pair_out = torch.empty_like(out)
    fused, pair = _fns(w, plan, fmt, out, pair_out, w.state, cache)
    fused_no_out, _ = _fns(w, plan, fmt, None, pair_out, w.state, cache)

    def compress():
        dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr,
                                  out=out)

    nb_c, extra = prefill_bytes(w)
    nbytes = nb_c + C.bytes_store(w, extra["n_compressed"], rows, fmt)
    common = dict(big=True, store_format=fmt, **extra)
    f = C.measure(ctx, name, "fused_prefill", fused, nbytes, check=check, **common)
    f0 = C.measure(ctx, name, "fused_prefill_no_out", fused_no_out, nbytes, **common)
    p = C.measure(ctx, name, "pair_prefill", pair, nbytes, **common)
    c = C.measure(ctx, name, "compress_prefill", compress, nb_c, **common)
    for r in (f, f0):
        r["vs_pair"], r["vs_pair_graph"] = _ratio(r, p, "time_us"), _ratio(r, p, "graph_us")
        r["vs_compress"], r["vs_compress_graph"] = (_ratio(r, c, "time_us"),
                                                    _ratio(r, c, "graph_us"))
    return [f, f0, p, c]


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    for label, hd, cr, fmt, online in DECODE_KERNELS:
        for bs in ctx.decode_bs():
            for pat in ("bnd", "open"):
                name = f"{label}_{fmt}/dec_bs{bs}_{pat}"
                out.append((name, lambda n=name, hd=hd, cr=cr, f=fmt, o=online, b=bs, p=pat:
                            _decode_case(ctx, n, hd, cr, f, o, b, p)))
    pname, reqs = ctx.prefill_cases()[0]
    for label, hd, cr, fmt in PREFILL_KERNELS:
        name = f"{label}_{fmt}/{pname}_padded"
        out.append((name, lambda n=name, hd=hd, cr=cr, f=fmt, q=reqs:
                    _prefill_case(ctx, n, hd, cr, f, q)))
    return out


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
