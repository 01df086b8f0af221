"""CUDA only: the V4.1 ops give the CPU kernels' bytes exactly (latent, ring, cache) on the
same inputs (contract V4.1 4.2: byte-identical backends)."""
import pytest
import torch

from op_samples import low_ratio_samples

import low_ratio_cases as lr
from low_ratio_cases import PAD, PairWorld

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda", 0)


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
def test_c1_kv_store_index_k_byte_identical(layout):
    g = lr.gen(124)
    n, ps, pages = 300, 64, 6
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
