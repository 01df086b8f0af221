#!/usr/bin/env python3
"""Byte-for-byte comparison of two dsv4_ops builds on one device (a refactor must not change
a byte).

    python scripts/compare_builds.py save CASES.pt [--device cuda]       # this tree's build
    python scripts/compare_builds.py check CASES.pt --tree OTHER_TREE    # same bytes there?

`save` builds a fixed set of compressor steps with dsv4_ops.testing.worlds (cr 4 hd 512 and
hd 128 on SWA-paged state, cr 128 on a request ring, cr 128 online; fp32 and bf16 state and
input; every store format), each a prefill extend over existing prefixes followed by one
decode step, runs them and saves the inputs with every output, state and cache byte. `check`
replays the same calls on the saved inputs through the plan classes and the two compressor
functions (the API every build has) and reports each tensor whose bytes differ. Exit status:
0 all equal, 1 some differ.
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
dsv4_ops = None  # the build under test, imported by main() from --tree

# (name, compress_ratio, head_dim, store format, online, state dtype, input dtype)
CASES = [
    ("c4_main_fp32", 4, 512, "fp8_ds_mla", False, torch.float32, torch.float32),
    ("c4_main_bf16", 4, 512, "bf16", False, torch.bfloat16, torch.bfloat16),
    ("c4_indexer_fp8", 4, 128, "fp8_indexer", False, torch.float32, torch.bfloat16),
    ("c4_indexer_fp4", 4, 128, "fp4_indexer", False, torch.bfloat16, torch.float32),
    ("c128_fp32", 128, 512, "fp8_ds_mla", False, torch.float32, torch.float32),
    ("c128_bf16", 128, 512, "fp8_ds_mla", False, torch.bfloat16, torch.float32),
    ("c128_online", 128, 512, "fp8_ds_mla", True, torch.float32, torch.float32),
]
# (seq_len, extend_len): fresh requests, requests with a prefix, windows closing mid-extend
REQUESTS = [(300, 300), (517, 40), (129, 1), (1030, 700), (7, 7), (256, 128)]
EPS = 1e-6


def _build(name, cr, hd, fmt, online, sdt, idt, device):
    from dsv4_ops.testing import worlds

    addressing = "online" if online else ("swa_paged" if cr == 4 else "req_ring")
    comp = dsv4_ops.Compressor(cr, hd, fmt, addressing, state_dtype=sdt)
    w = worlds.make_world(device, comp, REQUESTS, map_all_rows=True, state_fill="randn",
                          input_dtype=idt, max_context=2048, seed=sum(map(ord, name)))
    gen = torch.Generator().manual_seed(7)
    dec_rows = worlds.kv_score_rows(len(REQUESTS), cr, hd, gen).to(idt)
    pos = torch.tensor([s for s, _ in REQUESTS])  # the decode step's token positions
    full = w.req_to_token_cpu[w.rid_cpu, pos].to(torch.int64)
    dec_loc = torch.where((pos + 1) % cr == 0, full // cr, torch.full_like(full, -1))
    return dict(
        name=name, cr=cr, hd=hd, fmt=fmt, online=online, ring=w.ring, sps=w.swa_page_size,
        cps=w.cache_page_size, num_q=w.num_q, rid=w.rid_cpu, r2t=w.req_to_token_cpu.contiguous(),
        f2s=w.full_to_state_cpu, seq=w.seq_lens_cpu, ext=w.extend_lens_cpu,
        state=w.state.cpu(), kv_in=w.kv_in.cpu(), ape=w.ape.cpu(), norm=w.norm_weight.cpu(),
        freqs=w.freqs.cpu(), out_loc=w.out_loc_cpu, cache=w.kvcache().cpu(),
        dec_rows=dec_rows, dec_loc=dec_loc)


def _run(c, device):
    """The case's two steps; returns {tensor name: tensor} of everything they wrote."""
    d = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    state, cache = d["state"].clone(), d["cache"].clone()
    cr, hd = c["cr"], c["hd"]
    P, D = dsv4_ops.CompressorPrefillPlan, dsv4_ops.CompressorDecodePlan
    if c["online"]:
        plan = P.generate_online(c["seq"], c["ext"], d["rid"], d["r2t"], c["num_q"])
        dplan = D.generate_online(d["seq"] + 1, d["rid"], d["r2t"])
    else:
        plan = P.generate(cr, d["rid"], c["seq"], c["ext"], d["r2t"], d["f2s"], c["sps"],
                          c["ring"], c["num_q"])
        dplan = D.generate(cr, d["rid"], d["r2t"], d["f2s"], d["seq"] + 1, c["sps"], c["ring"])
    store = dict(norm_weight=d["norm"], norm_eps=EPS, freq_cis=d["freqs"], kvcache=cache,
                 page_size=c["cps"], use_fp4=c["fmt"] == "fp4_indexer",
                 bf16_store=c["fmt"] == "bf16")
    out = {}
    kv = dsv4_ops.compress_forward(state, d["kv_in"], d["ape"], plan, head_dim=hd,
                                   compress_ratio=cr, is_online=c["online"])
    dsv4_ops.compress_norm_rope_store(kv, plan, out_loc=d["out_loc"], **store)
    out["prefill_out"], out["prefill_state"] = kv.clone(), state.clone()
    out["prefill_cache"] = cache.clone()
    kv = dsv4_ops.compress_forward(state, d["dec_rows"], d["ape"], dplan, head_dim=hd,
                                   compress_ratio=cr, is_online=c["online"])
    dsv4_ops.compress_norm_rope_store(kv, dplan, out_loc=d["dec_loc"], **store)
    out["decode_out"], out["decode_state"], out["decode_cache"] = kv, state, cache
    return {k: v.cpu() for k, v in out.items()}


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("save", "check"))
    ap.add_argument("path")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tree", default=ROOT,
                    help="source tree whose in-place build is imported (default: this one)")
    args = ap.parse_args(argv)
    global dsv4_ops
    sys.path.insert(0, os.path.abspath(args.tree))
    import dsv4_ops
    torch.set_grad_enabled(False)
    if args.mode == "save":
        cases = [_build(*spec, device=args.device) for spec in CASES]
        for c in cases:
            c["outputs"] = _run(c, args.device)
        torch.save(cases, args.path)
        print(f"compare_builds: saved {len(cases)} cases ({dsv4_ops.__file__})")
        return 0
    cases = torch.load(args.path)
    bad = 0
    for c in cases:
        got = _run(c, args.device)
        for k, want in c["outputs"].items():
            same = torch.equal(_bytes(got[k]), _bytes(want))
            bad += not same
            if not same:
                n = int((_bytes(got[k]) != _bytes(want)).sum())
                print(f"compare_builds: {c['name']} {k}: {n} of {_bytes(want).numel()} bytes differ")
    total = sum(len(c["outputs"]) for c in cases)
    print(f"compare_builds: {total - bad} of {total} tensors byte-identical ({dsv4_ops.__file__})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
