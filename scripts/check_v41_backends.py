"""CUDA (or HIP) against CPU, byte for byte, for the V4.1 ops: c1, c2 decode / verify, c2 prefill,
kv_store, compress_norm_rope_store into every layout, and index-K, on random inputs with padded
rows, negative slots and rows outside the ring (contract V4.1 2.7: the backends write the same
bits). Exits 1 listing the cases whose outputs differ.

    python scripts/check_v41_backends.py [DEVICE]     # default cuda
"""
import sys
import torch
import dsv4_ops  # noqa: F401  (loads the library)
from dsv4_ops.layout import KVLayout

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
op = torch.ops.dsv4
torch.manual_seed(0)
LAYOUTS = ["v4", "v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new"]
bad = []


def both(fn, *args, outs=()):
    """Runs fn on CPU copies and on `dev` copies of args; compares the tensors at index `outs`."""
    a_cpu = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
    a_dev = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in args]
    fn(*a_cpu)
    fn(*a_dev)
    if dev != "cpu":
        torch.cuda.synchronize()
    res = []
    for i in outs:
        c, d = a_cpu[i], a_dev[i].cpu()
        same = torch.equal(c.view(torch.uint8) if c.dtype != torch.uint8 else c,
                           d.view(torch.uint8) if d.dtype != torch.uint8 else d)
        res.append(same)
    return res


def pb(layout, ps):
    return KVLayout.parse(layout).page_bytes(ps)


for layout in LAYOUTS:
    for ps in (2, 64):
        N, maxpos = 37, 300
        P = (4 * N) // ps + 2
        cache = torch.zeros(P, pb(layout, ps), dtype=torch.uint8)
        w = (torch.rand(512) + 0.5).bfloat16()
        freqs = torch.randn(maxpos, 64)
        # c1
        kv = (torch.randn(N, 512) * 3).bfloat16()
        pos = torch.randint(0, maxpos, (N,), dtype=torch.int64)
        loc = torch.randperm(P * ps)[:N].to(torch.int64)
        loc[0] = 0
        loc[1] = -1
        lat = torch.zeros(N, 512, dtype=torch.bfloat16)
        r = both(op.c1_norm_rope_store, kv, w, 1e-6, freqs, pos, loc, cache, ps, layout, lat,
                 outs=(6, 9))
        if not all(r):
            bad.append(("c1", layout, ps, r))
        # c2 decode / verify
        for D, ring in ((1, 2), (1, 8), (3, 8)):
            B = 6
            n = B * D
            state = torch.randn(B * ring + ring + 2, 1024)
            kvs = torch.randn(n, 1024) * 2
            req = torch.arange(B, dtype=torch.int64).repeat_interleave(D)
            p0 = torch.randint(1, 200, (B,))
            pos = (p0.repeat_interleave(D) + torch.arange(D).repeat(B)).to(torch.int64)
            raw = 2 * torch.randperm(P * ps - 1)[:n].to(torch.int64) + 3  # distinct slots >= 1
            raw[:D] = 0  # a padded block
            lat = torch.zeros(n, 512, dtype=torch.bfloat16)
            cache.zero_()
            r = both(op.c2_norm_rope_store, kvs, state, w, 1e-6, freqs, pos, req, raw, cache, ps,
                     ring, D, layout, lat, outs=(1, 8, 13))
            if not all(r):
                bad.append(("c2", layout, ps, D, ring, r))
        # c2 prefill
        lens = torch.tensor([5, 9, 1, 12, 0, 4], dtype=torch.int32)
        starts = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.int32), lens[:-1]]), 0).int()
        n = int(lens.sum()) + 3
        kvs = torch.randn(n, 1024)
        req = torch.zeros(n, dtype=torch.int64)
        pos = torch.zeros(n, dtype=torch.int64)
        for i, (s, l) in enumerate(zip(starts.tolist(), lens.tolist())):
            req[s:s + l] = i
            pos[s:s + l] = torch.arange(l) + (i % 3)
        raw = 2 * torch.randperm(P * ps - 1)[:n].to(torch.int64) + 3  # distinct slots >= 1
        raw[-3:] = 0
        raw[7] = 0
        for ring in (2, 8):
            state = torch.randn(6 * ring + ring + 2, 1024)
            lat = torch.zeros(n, 512, dtype=torch.bfloat16)
            cache.zero_()
            r = both(op.c2_prefill_norm_rope_store, kvs, state, w, 1e-6, freqs, pos, req, raw,
                     starts, lens, cache, ps, ring, layout, lat, outs=(1, 10, 14))
            if not all(r):
                bad.append(("c2_prefill", layout, ps, ring, r))
        # kv_store
        for xdt in (torch.bfloat16, torch.float32):
            x = (torch.randn(N, 512) * 4).to(xdt)
            loc = torch.randperm(P * ps)[:N].to(torch.int64)
            loc[3] = -1
            fr = torch.randn(N, 64) if layout not in ("v4", "uniform_fp8") else None
            cache.zero_()
            r = both(op.kv_store, x, loc, fr, cache, ps, layout, outs=(3,))
            if not all(r):
                bad.append(("kv_store", layout, ps, xdt, r))

# compress_norm_rope_store into every layout (decode plan, cr 4)
for layout in LAYOUTS:
    for kdt in (torch.bfloat16, torch.float32):
        for wdt in (torch.bfloat16, torch.float32):
            B, ps = 24, 2
            P = 4 * B // ps + 2
            rpi = torch.arange(B, dtype=torch.int64)
            seq = (torch.randint(1, 60, (B,)) * 4).to(torch.int64)
            seq[::5] += 1  # rows that close no window
            plan = op.plan_decode_legacy(rpi, seq, 4)
            kv = (torch.randn(B, 512) * 3).to(kdt)
            w = (torch.rand(512) + 0.5).to(wdt)
            freqs = torch.randn(300, 64)
            out_loc = torch.randperm(P * ps)[:B].to(torch.int64)
            cache = torch.zeros(P, pb(layout, ps), dtype=torch.uint8)
            r = both(op.compress_norm_rope_store, kv, plan, w, freqs, out_loc, cache, True, 4,
                     1e-6, ps, "fp8_ds_mla", layout, outs=(5,))
            if not all(r):
                bad.append(("compress_norm_rope_store", layout, kdt, wdt, r))

# index-K
for ratio in (1, 2):
    ps, P, N = 64, 4, 50
    cache = torch.zeros(P, 68 * ps, dtype=torch.uint8)
    k = (torch.randn(N, 128) * 2).bfloat16()
    w = (torch.rand(128) + 0.5).bfloat16()
    freqs = torch.randn(300, 64)
    pos = torch.randint(0, 300, (N,), dtype=torch.int64)
    loc = torch.randperm(P * ps)[:N].to(torch.int64)
    loc[0], loc[1] = 0, -1
    r = both(op.low_ratio_index_k_store, k, w, 1e-6, freqs, pos, loc, cache, ps, ratio,
             outs=(6,))
    if not all(r):
        bad.append(("index_k", ratio, r))

for case in bad:
    print("check_v41_backends: MISMATCH", case)
print(f"check_v41_backends: {len(bad)} mismatching cases ({dev} against cpu)")
sys.exit(1 if bad else 0)
