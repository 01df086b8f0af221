"""CUDA only: the V4.1 ops give the CPU kernels' bytes exactly (latent, ring, cache) on the
same inputs (contract V4.1 4.2: byte-identical backends), in both row mappings of the GPU
kernels: four lane groups a 512-dim row below one wave of rows, one lane group a row from
there (csrc/low_ratio/low_ratio_cuda.cu, row_chunks; compress_norm_rope_store into a V4.1
layout the same, csrc/store/store_cuda.cu, launch_store)."""
import pytest
import torch

from op_samples import low_ratio_samples

import low_ratio_cases as lr
from low_ratio_cases import PAD, PairWorld
from test_low_ratio_store import NON_V4, _cnrs, _cnrs_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda", 0)
# Rows around the default build's threshold: one wave, wave - 1 (four groups a row) and
# wave + 37 (one group a row, a partial last block).
AROUND_WAVE = {"wave-1": -1, "wave+37": 37}


def _wave_rows() -> int:
    """The rows from which the default build's launches run one lane group a 512-dim row
    (low_ratio_cuda.cu, row_chunks): the rows whose four lane groups (128 threads) the SMs
    hold at once."""
    p = torch.cuda.get_device_properties(CUDA)
    return p.multi_processor_count * (p.max_threads_per_multi_processor // 128)


@pytest.mark.parametrize("name", sorted(low_ratio_samples("cpu")))
def test_samples_byte_identical(name):
    op, cpu_args = low_ratio_samples("cpu")[name]
    cuda_args = [a.to(CUDA) if isinstance(a, torch.Tensor) else a for a in cpu_args]
    op(*cpu_args)
    op(*cuda_args)
    for i, a in enumerate(op.default._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            lr.assert_same_bits(cuda_args[i], cpu_args[i], f"{name}: {a.name}")


def _steps(device, layout, ps):
    """One mixed prefill, a decode step and two verify rounds; the kernel's latents and the
    world after each."""
    world = PairWorld(device, {2: 40, 0: 40, 4: 40, 1: 40}, ring=8, layout=layout,
                      page_size=ps, seed=123)
    world.park(2, 6)
    out = [world.prefill([(2, 7, 6), (0, 0, 9), (4, 10, 1), (1, 0, 19)], pad_tail=3, alias=2)]
    heads = {2: 13, 0: 9, 4: 11, 1: 19}
    out.append(world.decode([(rid, p) for rid, p in heads.items()] + [PAD], alias=0))
    heads = {rid: p + 1 for rid, p in heads.items()}
    for accepted in (2, 5):
        out.append(world.decode([(rid, heads[rid] + j) for rid in heads for j in range(5)]
                                + [PAD] * 5, draft_len=5, alias=1))
        for rid in heads:
            heads[rid] += accepted
            world.redraft(rid, heads[rid])
    return out, world


def _wave_launches(device, layout, n):
    """A c2 prefill of 3 n rows (n requests of 3 rows from position 0, 1 or 2: the odd first
    rows pair with the ring), a decode step of n rows and a verify round of >= n rows (3 a
    request), each with padded rows (raw_out_loc 0, rid 1); the latents, ring and cache after
    them. Every launch runs one lane group a row when n is at least one wave."""
    g = lr.gen(125)
    ring, ps = 4, 64
    rid = torch.arange(n)
    first = rid % 3
    pages = (6 * n + 2) // ps + 1  # compressed slot 1 + 6 rid + pos // 2 (pos <= 8)
    freqs, w = lr.random_freqs(12, g), lr.norm_weight(g)
    state, cache = lr.kv_score_rows(n * ring, g), lr.cache_for(layout, pages, ps, g)

    def rows(rids, pos, pad):
        raw = 2 * (1 + 6 * rids + pos // 2) + pos % 2
        z = torch.zeros(pad, dtype=lr.I64)
        return [lr.kv_score_rows(len(rids) + pad, g), torch.cat([pos, z]),
                torch.cat([rids, z + 1]), torch.cat([raw, z])]

    three = torch.arange(3)
    prefill = rows(rid.repeat_interleave(3), (first[:, None] + three).flatten(), 5)
    decode = rows(rid, first + 3, 3)
    v = torch.arange(n // 3 + 1)
    verify = rows(v.repeat_interleave(3), (first[v][:, None] + 4 + three).flatten(), 3)
    starts, lens = torch.arange(0, 3 * n, 3, dtype=lr.I32), torch.full((n,), 3, dtype=lr.I32)
    latents = [lr.random_bytes((len(r[0]), lr.HD), g, torch.bfloat16)
               for r in (prefill, decode, verify)]

    st, c, d_w, d_f = lr.to(device, state, cache, w, freqs)
    out = lr.to(device, *latents)
    lr.OPS.c2_prefill_norm_rope_store(*lr.to(device, prefill[0]), st, d_w, lr.EPS, d_f,
                                      *lr.to(device, *prefill[1:], starts, lens), c, ps, ring,
                                      layout.value, out[0])
    for (x, pos, req, raw), draft_len, lat in ((decode, 1, out[1]), (verify, 3, out[2])):
        lr.OPS.c2_norm_rope_store(*lr.to(device, x), st, d_w, lr.EPS, d_f,
                                  *lr.to(device, pos, req, raw), c, ps, ring, draft_len,
                                  layout.value, lat)
    return out, st, c


@pytest.mark.parametrize("ps", lr.PAGE_SIZES)
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_c2_steps_byte_identical(layout, ps):
    cpu_out, cpu_world = _steps("cpu", layout, ps)
    cuda_out, cuda_world = _steps(CUDA, layout, ps)
    for k, (a, b) in enumerate(zip(cuda_out, cpu_out)):
        lr.assert_same_bits(a, b, f"step {k} latent")
    lr.assert_same_bits(cuda_world.state, cpu_world.state, "ring")
    lr.assert_same_bits(cuda_world.cache, cpu_world.cache, "cache")


@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_c2_launches_past_a_wave_byte_identical(layout):
    """_wave_launches past one wave (one lane group a row); _steps' small launches run four."""
    n = _wave_rows() + AROUND_WAVE["wave+37"]
    cpu, cuda = _wave_launches("cpu", layout, n), _wave_launches(CUDA, layout, n)
    for k, (a, b) in enumerate(zip(cuda[0], cpu[0])):
        lr.assert_same_bits(a, b, f"{layout.value}: launch {k} latent")
    lr.assert_same_bits(cuda[1], cpu[1], f"{layout.value}: ring")
    lr.assert_same_bits(cuda[2], cpu[2], f"{layout.value}: cache")


@pytest.mark.parametrize("rows", [None, *AROUND_WAVE], ids=["300", *AROUND_WAVE])
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_c1_kv_store_index_k_byte_identical(layout, rows):
    g = lr.gen(124)
    n = 300 if rows is None else _wave_rows() + AROUND_WAVE[rows]
    ps = 64
    pages = n // ps + 2
    kv = lr.kv_rows(n, g)
    w, w128 = lr.norm_weight(g), lr.norm_weight(g, lr.INDEX_DIM)
    freqs = lr.random_freqs(512, g)
    pos = torch.randint(0, 512, (n,), generator=g)
    loc = torch.randperm(pages * ps, generator=g)[:n] - 2          # -2, -1 and 0 among them
    cache = lr.cache_for(layout, pages, ps, g)
    latent = lr.random_bytes((n, lr.HD), g, torch.bfloat16)
    k = lr.kv_rows(n, g, lr.INDEX_DIM)
    icache = lr.random_bytes((pages, 68 * ps), g)
    x32 = torch.randn(n, lr.HD, generator=g) * 4
    freqs_rows = lr.random_freqs(n, g)
    results = []
    for dev in ("cpu", CUDA):
        c, lat, ic = cache.clone().to(dev), latent.clone().to(dev), icache.clone().to(dev)
        lr.c1_launch(kv.to(dev), w.to(dev), freqs.to(dev), pos.to(dev), loc.to(dev), c, ps,
                     layout, lat)
        for ratio in (1, 2):
            lr.OPS.low_ratio_index_k_store(k.to(dev), w128.to(dev), lr.EPS, freqs.to(dev),
                                           pos.to(dev), loc.to(dev), ic, ps, ratio)
        s32, s16 = cache.clone().to(dev), cache.clone().to(dev)
        rope = layout.value not in ("v4", "uniform_fp8")
        fr = freqs_rows.to(dev) if rope else None
        lr.OPS.kv_store(x32.to(dev), loc.to(dev), fr, s32, ps, layout.value)
        lr.OPS.kv_store(x32.bfloat16().to(dev), loc.to(dev), fr, s16, ps, layout.value)
        results.append([lat, c, ic, s32, s16])
    for name, a, b in zip(["c1 latent", "c1 cache", "index-K cache", "kv_store fp32",
                           "kv_store bf16"], results[1], results[0]):
        lr.assert_same_bits(a, b, f"{layout.value}: {name}")


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("rows", [1, 7, -1, 0], ids=["1", "7", "wave-1", "wave"])
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_kv_store_row_mappings_byte_identical(layout, rows, aligned):
    """kv_store in both row mappings (four lane groups a row below one wave of rows, one from
    there); inputs at an odd element offset take the scalar loads."""
    g = lr.gen(125)
    n = rows if rows > 0 else _wave_rows() + rows
    ps = 64
    pages = n // ps + 2
    loc = torch.randperm(pages * ps, generator=g)[:n] - 2          # -2, -1 and 0 among them
    cache = lr.cache_for(layout, pages, ps, g)
    rope = layout.value not in ("v4", "uniform_fp8")
    x32 = torch.randn(n, lr.HD, generator=g) * 4
    fr = lr.random_freqs(n, g)
    out = {}
    for dev in ("cpu", CUDA):
        def place(t):
            return t.to(dev) if aligned else lr.at_odd_offset(t.to(dev))
        for name, x in (("fp32", x32), ("bf16", x32.bfloat16())):
            c = cache.clone().to(dev)
            lr.OPS.kv_store(place(x), loc.to(dev), place(fr) if rope else None, c, ps,
                            layout.value)
            out[dev, name] = c
    for name in ("fp32", "bf16"):
        lr.assert_same_bits(out[CUDA, name], out["cpu", name], f"{layout.value}: kv_store {name}")


def _store_split_rows() -> int:
    """The most rows for which compress_norm_rope_store runs a V4.1 layout's row in four lane
    groups (store_kernel.cuh, kStoreSplitRowsPerSm: 2 rows an SM)."""
    return 2 * torch.cuda.get_device_properties(CUDA).multi_processor_count


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [40, 0, 1], ids=["40", "split", "split+1"])
@pytest.mark.parametrize("layout", NON_V4, ids=[v.value for v in NON_V4])
def test_compress_norm_rope_store_layouts_byte_identical(layout, rows, kv_dtype):
    """Both mappings of compress_norm_rope_store's V4.1 rows (four lane groups a row up to 2
    rows an SM, one from there), with rows that store nothing: out_loc -1 and past the cache."""
    n = rows if rows > 1 else _store_split_rows() + rows
    kv, w, freqs, _, loc, plan, cache = _cnrs_case(126, n, kv_dtype, layout)
    loc[::7] = -1
    loc[3::11] = cache.shape[0] * 64 + 5
    got = _cnrs(CUDA, kv, plan, w, freqs, loc, cache, 64, "fp8_ds_mla", layout.value)
    want = _cnrs("cpu", kv, plan, w, freqs, loc, cache, 64, "fp8_ds_mla", layout.value)
    lr.assert_same_bits(got, want, f"compress_norm_rope_store {layout.value}, {n} rows")
    assert not torch.equal(got, cache)
