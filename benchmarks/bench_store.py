#!/usr/bin/env python3
"""compress_norm_rope_store benchmarks (docs/contract.md 4) and the decode step (compress + store).

store: the compressed tokens of the compress cases, per cache format:
  fp8_ds_mla (main hd512, cr 4 and cr 128), bf16 (main hd512 cr 4), fp8_indexer and
  fp4_indexer (indexer hd128 cr 4); decode batch 1/8/64/256/1024 with every request closing a
  window ("bnd"; plus "rand" at the largest batch: mostly inactive rows, which must write
  nothing) and prefill 8x4096, 1x32768, 4x(2000+2048). The kv input is random fp32 [N, hd],
  the norm weights fp32, out_loc int64; "_bf16w_i32loc" cases: bf16 weights, int32 out_loc.
  Speed-up column: dsv4_ops.testing.reference.store (float64 norm/rope, torch's own fp8/bf16
  conversions, index scatter) of the same tokens.
step: one decode step of one request, compress_forward then compress_norm_rope_store, for
  every combo and format (and the online cr128 state), closing a window ("bnd") or not
  ("open"); the CUDA-graph replay time is the figure of merit (a serving engine replays
  decode steps from graphs).

    python benchmarks/bench_store.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks.bench_compress import compress_fn, decode_bytes, decode_plan, prefill_plan

FAMILY = "store"
STEP_FAMILY = "step"
# (store format, head_dim, ratio)
STORE_CASES = [("fp8_ds_mla", 512, 4), ("fp8_ds_mla", 512, 128), ("bf16", 512, 4),
               ("fp8_indexer", 128, 4), ("fp4_indexer", 128, 4)]
# Stores fed bf16 norm weights and int32 out_loc, as a serving engine may (the fp32 / int64 cases
# above are the reference engine harness's): decode 8 closing rows and the first prefill. The
# kernel's round of input loads is laid out per dtype (store/store_kernel.cuh, load_bits).
NARROW_CASES = [("fp8_ds_mla", 512, 4), ("fp8_indexer", 128, 4)]
# (label, head_dim, ratio, store format, online)
STEP_CASES = [("main", 512, 4, "fp8_ds_mla", False), ("main", 512, 4, "bf16", False),
              ("main", 512, 128, "fp8_ds_mla", False), ("indexer", 128, 4, "fp8_indexer", False),
              ("indexer", 128, 4, "fp4_indexer", False), ("online", 512, 128, "fp8_ds_mla", True)]


def store_fn(w: C.World, kv: torch.Tensor, plan, store_format: str, narrow: bool = False
             ) -> Callable[[], Any]:
    """narrow: bf16 norm weights and int32 out_loc instead of fp32 / int64."""
    import dsv4_ops

    cache = w.kvcache(store_format)
    flags = C.store_flags(store_format)
    norm_w = w.norm_weight.to(torch.bfloat16) if narrow else w.norm_weight
    out_loc = w.out_loc.to(torch.int32) if narrow else w.out_loc
    return lambda: dsv4_ops.compress_norm_rope_store(
        kv, plan, norm_weight=norm_w, norm_eps=C.NORM_EPS, freq_cis=w.freqs, out_loc=out_loc,
        kvcache=cache, page_size=w.cache_page_size, **flags)


def written_slots(w: C.World, store_format: str) -> int:
    """Cache slots whose token data is not all zero (the cache starts zeroed)."""
    import dsv4_ops

    return C.slots_with_data(w.kvcache(store_format), w.cache_page_size,
                             dsv4_ops.STORE_FORMATS[store_format].data_bytes)


def _store_case(ctx, name, fmt, hd, ratio, reqs, decode: bool, padded: bool = False,
                narrow: bool = False) -> List[Dict[str, Any]]:
    w = C.make_world(ratio=ratio, head_dim=hd, reqs=reqs, device=ctx.device,
                     seed=C.case_seed(name), fill=False)
    plan = decode_plan(w) if decode else prefill_plan(w, padded)
    n_rows = plan[1].shape[0]
    kv = torch.randn(n_rows, hd, device=w.device,
                     generator=torch.Generator(device=w.device).manual_seed(7))
    n_tok = C.decode_closing(w) if decode else C.prefill_counts(w)["n_c"]
    fn = store_fn(w, kv, plan, fmt, narrow)
    fn()
    got = written_slots(w, fmt)
    check = "ok" if got == n_tok else f"slots written {got} != {n_tok}"
    ref = C.ref_store_fn(ctx, w, kv, fmt)
    op = "store_decode" if decode else "store_prefill"
    return [C.measure(ctx, name, op, fn, C.bytes_store(w, n_tok, n_rows, fmt), big=w.num_q >= 4096,
                      ref_fn=ref, bs=w.batch_size, n_compressed=n_tok, store_format=fmt, check=check)]


def _decode_store_case(ctx, tag, fmt, hd, r, bs, pat, narrow=False):
    """(name, thunk) of a decode store case: bs requests with `pat` lengths."""
    name = f"{tag}/dec_bs{bs}_{pat}"
    seqs = C.decode_lengths(bs, pat, r, C.case_seed(name))
    return (name, lambda: _store_case(ctx, name, fmt, hd, r, [(s, 1) for s in seqs], True,
                                      narrow=narrow))


def store_cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    big_bs = ctx.decode_bs()[-1]
    for fmt, hd, r in STORE_CASES:
        tag = f"{fmt}_c{r}"
        for bs in ctx.decode_bs():
            for pat in ("bnd", "rand"):
                if pat == "rand" and bs != big_bs:
                    continue
                out.append(_decode_store_case(ctx, tag, fmt, hd, r, bs, pat))
        # padded plans: the bytes model counts the valid rows' data only
        for pname, reqs, padded in ctx.prefill_variants():
            name = f"{tag}/{pname}"
            out.append((name, lambda n=name, f=fmt, hd=hd, r=r, q=reqs, p=padded:
                        _store_case(ctx, n, f, hd, r, q, False, padded=p)))
    for fmt, hd, r in NARROW_CASES:
        tag = f"{fmt}_c{r}_bf16w_i32loc"
        out.append(_decode_store_case(ctx, tag, fmt, hd, r, 8, "bnd", narrow=True))
        pname, reqs = ctx.prefill_cases()[0]
        name = f"{tag}/{pname}"
        out.append((name, lambda n=name, f=fmt, hd=hd, r=r, q=reqs:
                    _store_case(ctx, n, f, hd, r, q, False, narrow=True)))
    return out


def _step_case(ctx, name, hd, ratio, fmt, online, pattern) -> List[Dict[str, Any]]:
    seqs = C.decode_lengths(1, pattern, ratio, C.case_seed(name))
    w = C.make_world(ratio=ratio, head_dim=hd, reqs=[(s, 1) for s in seqs], device=ctx.device,
                     seed=C.case_seed(name), online=online)
    plan = decode_plan(w)
    out = torch.empty(w.batch_size, hd, dtype=w.input_dtype, device=w.device)
    comp = compress_fn(w, plan, out)
    st = store_fn(w, out, plan, fmt)

    def step():
        comp()
        st()

    nb_c, extra = decode_bytes(w)
    nbytes = nb_c + C.bytes_store(w, extra["n_compressed"], w.batch_size, fmt)
    return [C.measure(ctx, name, "decode_step", step, nbytes, store_format=fmt, bs=1, **extra)]


def step_cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    for label, hd, r, fmt, online in STEP_CASES:
        for pat in ("bnd", "open"):
            name = f"{'online' if online else label}{hd}_c{r}_{fmt}/step_bs1_{pat}"
            out.append((name, lambda n=name, hd=hd, r=r, f=fmt, o=online, p=pat:
                        _step_case(ctx, n, hd, r, f, o, p)))
    return out


rows = C.family_rows(FAMILY, store_cases)
step_rows = C.family_rows(STEP_FAMILY, step_cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, lambda ctx: rows(ctx) + step_rows(ctx), __doc__))
