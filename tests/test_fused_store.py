"""compress_and_store (docs/contract.md 11) against the unfused pair it replaces:
compress_forward, then compress_norm_rope_store of its rows, with the same arguments. Both run
on copies of one world (random state rows, a cache of random bytes); the fused call must leave
the same state rows, the same cache bytes and (when given) the same `out`, bit for bit, for
every kernel (cr 4 hd 512 / 128, cr 128 offline hd 512 / 128, online cr 128), decode and
prefill (trimmed and padded plans), every addressing mode, every store format and V4.1
layout, state / input dtypes, DCP ranks and a row-strided kv_score_input. The pair itself is
checked against the whole-sequence oracle in test_compress.py and test_store.py. Bad input
raises naming compress_and_store and the argument. The samples of op_samples.fused_samples go
through PyTorch's machinery (sample_tests: opcheck, writes, meta tensors, torch.compile)."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import (Compressor, CompressorDecodePlan, CompressorPrefillPlan, KVLayout,
                      compress_and_store, compress_forward, compress_norm_rope_store)
from dsv4_ops.testing import worlds

from low_ratio_cases import at_odd_offset
from op_samples import fused_samples
from sample_tests import sample_tests

F32, BF16 = torch.float32, torch.bfloat16
SPS = 64  # SWA page size

# (compress_ratio, head_dim, addressing)
KERNELS = [(4, 512, "swa_paged"), (4, 512, "req_ring"), (4, 512, "legacy"),
           (4, 128, "swa_paged"), (4, 128, "legacy"), (128, 512, "req_ring"),
           (128, 512, "legacy"), (128, 128, "req_ring"), (128, 512, "online")]
KERNEL_IDS = [f"c{cr}-hd{hd}-{a}" for cr, hd, a in KERNELS]
# (store format flags, layout) per head_dim
STORES = {512: [("fp8_ds_mla", "v4"), ("bf16", "v4"), ("fp8_ds_mla", "v41"),
                ("fp8_ds_mla", "v41_fp4_new")],
          128: [("fp8_indexer", "v4"), ("fp4_indexer", "v4")]}
FLAGS = {"fp8_ds_mla": {}, "bf16": {"bf16_store": True}, "fp8_indexer": {},
         "fp4_indexer": {"use_fp4": True}}

DECODE_SEQ = {4: [16, 9, 12, 33, 8], 128: [256, 130, 384, 129, 128]}
PREFILL_REQUESTS = {4: [(37, 37), (300, 45), (21, 3), (64, 1)],
                    128: [(300, 300), (520, 150), (260, 5), (129, 2)]}


test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors, \
    test_compiled_equals_eager = sample_tests(fused_samples)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.uint8 or t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def world_for(device, cr, hd, addressing, sdt, idt, decode, seed=0):
    reqs = ([(s, 1) for s in DECODE_SEQ[cr]] if decode else PREFILL_REQUESTS[cr])
    comp = Compressor(cr, hd, addressing=addressing, state_dtype=sdt)
    return worlds.make_world(device, comp, reqs, num_req_rows=len(reqs) + 2, page_size=SPS,
                             max_context=640, map_all_rows=True, state_fill="randn",
                             input_dtype=idt, seed=seed)


def plan_for(w, decode, padded=False, pad=7):
    cr, a = w.compress_ratio, w.compressor.addressing
    if decode:
        if a == "online":
            return CompressorDecodePlan.generate_online(w.seq_lens, w.rid, w.req_to_token)
        if a == "legacy":
            return CompressorDecodePlan.generate_legacy(cr, w.rid, w.seq_lens)
        return CompressorDecodePlan.generate(cr, w.rid, w.req_to_token, w.full_to_state,
                                             w.seq_lens, SPS, w.ring, use_req_ring=a == "req_ring")
    num_q = w.num_q + (pad if padded else 0)
    if a == "online":
        return CompressorPrefillPlan.generate_online(w.seq_lens_cpu, w.extend_lens_cpu, w.rid,
                                                     w.req_to_token, num_q, use_cuda_graph=padded)
    if a == "legacy":
        return CompressorPrefillPlan.generate_legacy(cr, w.rid, w.seq_lens_cpu, w.extend_lens_cpu,
                                                     num_q, w.device, use_cuda_graph=padded)
    return CompressorPrefillPlan.generate(cr, w.rid, w.seq_lens_cpu, w.extend_lens_cpu,
                                          w.req_to_token, w.full_to_state, SPS, w.ring, num_q,
                                          use_cuda_graph=padded, use_req_ring=a == "req_ring")


def random_cache(w, fmt, layout, pages=None, seed=5):
    """A cache of random bytes: the pair and the fused op must change the same ones."""
    pages = pages or w.num_pages
    ps = w.cache_page_size
    nbytes = (KVLayout.parse(layout).page_bytes(ps) if layout != "v4"
              else dsv4_ops.cache_page_bytes(fmt, ps))
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (pages, nbytes), dtype=torch.uint8, generator=g).to(w.device)


def inputs_for(w, decode, padded, strided, gen, pad=7):
    """kv_score_input (the world's rows, padded with zero rows for a padded prefill plan),
    optionally as a column slice of a wider projection output, and out_loc per plan row kind."""
    kv_in = w.kv_in
    if not decode and padded:
        kv_in = torch.cat([kv_in, kv_in.new_zeros(pad, kv_in.shape[1])])
    if strided:
        wide = torch.randn(kv_in.shape[0], kv_in.shape[1] + 64, generator=gen)
        wide = wide.to(kv_in.dtype).to(kv_in.device)
        view = wide[:, 32:32 + kv_in.shape[1]]
        view.copy_(kv_in)
        kv_in = view
    out_loc = w.out_loc  # per query token: its window's slot where it closes one, else -1
    if not decode and padded:
        out_loc = torch.cat([out_loc, torch.full((pad,), -1, dtype=out_loc.dtype,
                                                 device=out_loc.device)])
    return kv_in, out_loc


def run_both(w, plan, kv_in, out_loc, fmt, layout, out_dtype, dcp=(1, 0, 1), cache=None,
             norm_weight=None, freqs=None, copy_cache=torch.Tensor.clone):
    """(pair, fused): (state, cache, out) after the unfused pair and after compress_and_store on
    copies of the world's state and of one cache (made by copy_cache). out_dtype None: the
    fused call without `out` (the pair's rows then have kv_score_input's dtype,
    compress_forward's default)."""
    cr, hd = w.compress_ratio, w.head_dim
    cache = random_cache(w, fmt, layout) if cache is None else cache
    store = dict(norm_weight=w.norm_weight if norm_weight is None else norm_weight,
                 norm_eps=1e-6, freq_cis=w.freqs if freqs is None else freqs, out_loc=out_loc,
                 page_size=w.cache_page_size, layout=layout, dcp_world_size=dcp[0],
                 dcp_rank=dcp[1], dcp_interleave=dcp[2], **FLAGS[fmt])
    rows = plan[1].shape[0]
    results = []
    for fused in (False, True):
        state, kvcache = w.state.clone(), copy_cache(cache)
        out = (None if out_dtype is None and fused
               else torch.empty((rows, hd), dtype=out_dtype or kv_in.dtype, device=w.device))
        if fused:
            got = compress_and_store(state, kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr,
                                     kvcache=kvcache, is_online=w.is_online, out=out, **store)
            assert got is out
        else:
            compress_forward(state, kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr,
                             out=out, is_online=w.is_online)
            compress_norm_rope_store(out, plan, kvcache=kvcache, **store)
        results.append((state, kvcache, out))
    return cache, results[0], results[1]


def assert_same(w, cache, pair, fused, out_given, expect_store=True):
    (s0, c0, o0), (s1, c1, o1) = pair, fused
    assert torch.equal(bits(s0), bits(s1)), "state rows differ from the pair's"
    assert torch.equal(bits(c0), bits(c1)), "cache bytes differ from the pair's"
    if out_given:
        assert torch.equal(bits(o0), bits(o1)), "out differs from the pair's"
    assert not torch.equal(bits(s0), bits(w.state)), "no state row written: proves nothing"
    if expect_store:
        assert not torch.equal(bits(c0), bits(cache)), "nothing stored: proves nothing"


def _cases():
    for cr, hd, a in KERNELS:
        for fmt, layout in STORES[hd]:
            yield pytest.param(cr, hd, a, fmt, layout,
                               id=f"c{cr}-hd{hd}-{a}-{fmt}-{layout}")


CASES = list(_cases())


@pytest.mark.parametrize("out_dtype", [None, F32, BF16], ids=["no_out", "out_f32", "out_bf16"])
@pytest.mark.parametrize("cr,hd,addressing,fmt,layout", CASES)
def test_decode_equals_pair(device, cr, hd, addressing, fmt, layout, out_dtype):
    w = world_for(device, cr, hd, addressing, F32, F32, decode=True)
    plan = plan_for(w, True)
    kv_in, out_loc = inputs_for(w, True, False, False, None)
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, layout, out_dtype)
    assert_same(w, cache, pair, fused, out_dtype is not None)


@pytest.mark.parametrize("padded", [False, True], ids=["trimmed", "padded"])
@pytest.mark.parametrize("cr,hd,addressing,fmt,layout", CASES)
def test_prefill_equals_pair(device, cr, hd, addressing, fmt, layout, padded):
    w = world_for(device, cr, hd, addressing, F32, F32, decode=False)
    plan = plan_for(w, False, padded)
    kv_in, out_loc = inputs_for(w, False, padded, False, None)
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, layout, F32 if padded else None)
    assert_same(w, cache, pair, fused, padded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("hd,addressing,fmt,layout", [
    (512, "swa_paged", "fp8_ds_mla", "v4"), (512, "req_ring", "fp8_ds_mla", "v41_fp4_new"),
    (128, "legacy", "fp4_indexer", "v4")], ids=["hd512-fp8_ds_mla", "hd512-v41_fp4_new",
                                               "hd128-fp4_indexer"])
def test_long_padded_prefill_equals_pair(hd, addressing, fmt, layout):
    """A padded cr 4 plan past 16 waves of resident blocks: the fused prefill kernel's blocks
    take their record groups in turn (c4_prefill_turns), storing each."""
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    groups = 16 * 4 * sms + 3 * sms + 5  # DSV4_C4_MIN_BLOCKS = 4 blocks an SM
    w = world_for(dev, 4, hd, addressing, F32, F32, decode=False)
    pad = groups * (128 // (hd // 4)) - w.num_q
    plan = plan_for(w, False, True, pad)
    kv_in, out_loc = inputs_for(w, False, True, False, None, pad)
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, layout, F32)
    assert_same(w, cache, pair, fused, True)


DTYPES = [(F32, BF16), (BF16, F32), (BF16, BF16)]
DTYPE_IDS = ["sf32-ibf16", "sbf16-if32", "sbf16-ibf16"]


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("sdt,idt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cr,hd,addressing", [(4, 512, "swa_paged"), (4, 128, "req_ring"),
                                              (128, 512, "req_ring"), (128, 512, "online")],
                         ids=["c4-hd512", "c4-hd128", "c128-hd512", "c128-online"])
def test_dtypes_equal_pair(device, cr, hd, addressing, sdt, idt, decode):
    """bf16 state and / or input rows; without `out` the pooled rows are bf16 where the input
    is (the pair's default), and the V4.1 layout rounds the rows to that dtype."""
    w = world_for(device, cr, hd, addressing, sdt, idt, decode=decode, seed=3)
    plan = plan_for(w, decode)
    kv_in, out_loc = inputs_for(w, decode, False, False, None)
    fmt, layout = ("fp8_ds_mla", "v41") if hd == 512 else ("fp4_indexer", "v4")
    for out_dtype in (None, F32):
        cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, layout, out_dtype)
        assert_same(w, cache, pair, fused, out_dtype is not None)


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("cr,hd,addressing", [(4, 512, "swa_paged"), (4, 128, "legacy"),
                                              (128, 512, "req_ring"), (128, 512, "online")],
                         ids=["c4-hd512", "c4-hd128", "c128-hd512", "c128-online"])
def test_strided_input_equals_pair(device, cr, hd, addressing, decode):
    """kv_score_input as a column slice of a wider projection output, read in place."""
    gen = torch.Generator().manual_seed(17)
    w = world_for(device, cr, hd, addressing, F32, F32, decode=decode, seed=4)
    plan = plan_for(w, decode)
    kv_in, out_loc = inputs_for(w, decode, False, True, gen)
    assert kv_in.stride(0) != kv_in.shape[1]
    fmt = "fp8_ds_mla" if hd == 512 else "fp8_indexer"
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, "v4", F32)
    assert_same(w, cache, pair, fused, True)


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "prefill"])
@pytest.mark.parametrize("fmt,layout", [("fp8_ds_mla", "v4"), ("fp8_ds_mla", "v41"),
                                        ("fp4_indexer", "v4")])
def test_dcp_ranks_equal_pair(device, fmt, layout, decode):
    """DCP (contract 9): every rank's local cache after the fused call is the pair's."""
    hd = 512 if fmt == "fp8_ds_mla" else 128
    w = world_for(device, 4, hd, "swa_paged", F32, F32, decode=decode, seed=6)
    plan = plan_for(w, decode)
    kv_in, out_loc = inputs_for(w, decode, False, False, None)
    ws, inter = 2, 2
    pages = dsv4_ops.dcp_local_pages(w.num_pages, w.cache_page_size, ws, inter)
    stored = 0
    for rank in range(ws):
        cache = random_cache(w, fmt, layout, pages=pages, seed=10 + rank)
        cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, layout, None,
                                      dcp=(ws, rank, inter), cache=cache)
        assert_same(w, cache, pair, fused, False, expect_store=False)
        stored += int(not torch.equal(bits(pair[1]), bits(cache)))
    assert stored == ws, "a rank stored nothing: the test proves less than it says"


@pytest.mark.parametrize("form", ["bf16_weight", "int32_out_loc", "unaligned"])
@pytest.mark.parametrize("cr,hd,addressing,fmt", [
    (4, 512, "swa_paged", "fp8_ds_mla"), (4, 512, "legacy", "bf16"),
    (4, 128, "swa_paged", "fp4_indexer"), (4, 128, "legacy", "fp8_indexer"),
    (128, 512, "online", "fp8_ds_mla"), (128, 512, "online", "bf16")],
    ids=["c4-hd512-fp8_ds_mla", "c4-hd512-bf16", "c4-hd128-fp4", "c4-hd128-fp8",
         "online-fp8_ds_mla", "online-bf16"])
def test_argument_forms_equal_pair(device, cr, hd, addressing, fmt, form):
    """The store's other argument forms through the fused decode kernels' own store steps:
    bf16 norm weights, an int32 out_loc, and norm weights, rope table and cache at odd
    offsets (the element-wise and byte-wise paths)."""
    w = world_for(device, cr, hd, addressing, F32, F32, decode=True, seed=8)
    plan = plan_for(w, True)
    kv_in, out_loc = inputs_for(w, True, False, False, None)
    extra = {}
    if form == "bf16_weight":
        extra["norm_weight"] = w.norm_weight.to(BF16)
    elif form == "int32_out_loc":
        out_loc = out_loc.to(torch.int32)
    else:
        extra.update(norm_weight=at_odd_offset(w.norm_weight), freqs=at_odd_offset(w.freqs),
                     copy_cache=at_odd_offset)
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, fmt, "v4", F32, **extra)
    assert_same(w, cache, pair, fused, True)


def test_steps_that_close_no_window(device):
    """A decode step in which no request closes a window writes state rows and no cache byte,
    as the pair does."""
    comp = Compressor(4, 512)
    w = worlds.make_world(device, comp, [(5, 1), (10, 1), (7, 1)], num_req_rows=5,
                          page_size=SPS, max_context=640, map_all_rows=True, state_fill="randn")
    plan = plan_for(w, True)
    kv_in, out_loc = inputs_for(w, True, False, False, None)
    cache, pair, fused = run_both(w, plan, kv_in, out_loc, "fp8_ds_mla", "v4", F32)
    assert_same(w, cache, pair, fused, True, expect_store=False)
    assert torch.equal(bits(fused[1]), bits(cache)), "a step that closes no window stored"
    assert not bool(fused[2].any()), "rows that close no window must be zeros"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cr,hd,addressing,fmt,layout,kernels", [
    (4, 512, "swa_paged", "fp8_ds_mla", "v4", ["c4_decode_store_kernel"]),
    (4, 512, "req_ring", "fp8_ds_mla", "v41_fp4", ["c4_decode_store_kernel"]),
    (4, 128, "legacy", "fp4_indexer", "v4", ["c4_decode_store_kernel"]),
    (128, 512, "online", "fp8_ds_mla", "v4", ["online_decode_store_kernel"]),
    (128, 512, "req_ring", "fp8_ds_mla", "v4",
     ["c128_decode_kernel", "compress_norm_rope_store_kernel"]),
], ids=["c4-hd512", "c4-hd512-v41_fp4", "c4-hd128", "c128-online", "c128-offline"])
def test_decode_launches(cr, hd, addressing, fmt, layout, kernels):
    """The kernels one decode call launches (docs/design/fused.md): one for c4 and online cr
    128 (V4.1 layouts too), the pair's two for cr 128 offline."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda", 0)
    w = world_for(dev, cr, hd, addressing, F32, F32, decode=True)
    plan = plan_for(w, True)
    cache = random_cache(w, fmt, layout)
    kw = dict(head_dim=hd, compress_ratio=cr, is_online=w.is_online, norm_weight=w.norm_weight,
              norm_eps=1e-6, freq_cis=w.freqs, out_loc=w.out_loc, kvcache=cache,
              page_size=w.cache_page_size, layout=layout, **FLAGS[fmt])
    compress_and_store(w.state, w.kv_in, w.ape, plan, **kw)  # warm-up: no lazy work profiled
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        compress_and_store(w.state, w.kv_in, w.ape, plan, **kw)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) == len(kernels), names
    for want, got in zip(kernels, names):
        assert want in got, names


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cr,hd,addressing,fmt,layout,kernels", [
    (4, 512, "swa_paged", "fp8_ds_mla", "v4", ["c4_prefill_store_kernel", "write_rows_kernel"]),
    (4, 128, "legacy", "fp8_indexer", "v4", ["c4_prefill_store_kernel", "write_rows_kernel"]),
    (128, 512, "req_ring", "fp8_ds_mla", "v41", ["c128_prefill_kernel", "write_rows_store_kernel"]),
    (128, 512, "online", "fp8_ds_mla", "v4",
     ["c128_prefill_kernel", "c128_prefill_kernel", "compress_norm_rope_store_kernel"]),
], ids=["c4-hd512", "c4-hd128", "c128-offline", "c128-online"])
def test_prefill_launches(cr, hd, addressing, fmt, layout, kernels):
    """The kernels one prefill call launches (docs/design/fused.md): two for an offline plan
    (cr 4: pooling and store, then the row writes; cr 128: the pooling, then the row writes and
    the store), the pair's three for an online one."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda", 0)
    w = world_for(dev, cr, hd, addressing, F32, F32, decode=False)
    plan = plan_for(w, False, True)
    kv_in, out_loc = inputs_for(w, False, True, False, None)
    cache = random_cache(w, fmt, layout)
    kw = dict(head_dim=hd, compress_ratio=cr, is_online=w.is_online, norm_weight=w.norm_weight,
              norm_eps=1e-6, freq_cis=w.freqs, out_loc=out_loc, kvcache=cache,
              page_size=w.cache_page_size, layout=layout, **FLAGS[fmt])
    compress_and_store(w.state.clone(), kv_in, w.ape, plan, **kw)  # warm-up
    torch.cuda.synchronize()
    state = w.state.clone()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        compress_and_store(state, kv_in, w.ape, plan, **kw)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert len(names) == len(kernels), names
    for want, got in zip(kernels, names):
        assert want in got, names


# ---- errors -------------------------------------------------------------------------------------

def _raw_args(device):
    w = world_for(device, 4, 512, "swa_paged", F32, F32, decode=True)
    plan = plan_for(w, True)
    kv_in, out_loc = inputs_for(w, True, False, False, None)
    cache = random_cache(w, "fp8_ds_mla", "v4")
    out = torch.empty((plan.plan_d.shape[0], 512), device=w.device)
    return dict(kv_score_buffer=w.state.clone(), kv_score_input=kv_in, ape=w.ape,
                plan=plan.plan_d, plan_w=None, norm_weight=w.norm_weight, freqs=w.freqs_real,
                out_loc=out_loc, kvcache=cache, out=out, head_dim=512, compress_ratio=4,
                is_online=False, eps=1e-6, page_size=w.cache_page_size,
                store_format="fp8_ds_mla"), w


def _call(a):
    torch.ops.dsv4.compress_and_store(*a.values())


BAD = {
    "head_dim": (lambda a: a.update(head_dim=256, out=None), r"head_dim must be 128 or 512"),
    "store_format": (lambda a: a.update(store_format="fp8_indexer"),
                     r"store_format fp8_indexer stores rows of 128 dims, but head_dim is 512"),
    "store_format_name": (lambda a: a.update(store_format="fp16"),
                          r"store_format must be one of"),
    "compress_ratio": (lambda a: a.update(compress_ratio=8), r"compress_ratio must be 4 or 128"),
    "out_shape": (lambda a: a.update(out=a["out"][:, :128]), r"out must be \["),
    "out_is_cache": (lambda a: a.update(out=a["kvcache"].view(-1)[:a["plan"].shape[0] * 2048]
                                        .view(torch.float32).view(-1, 512)),
                     r"out must not share memory with kvcache"),
    "norm_weight": (lambda a: a.update(norm_weight=a["norm_weight"][:128]),
                    r"norm_weight must have 512 elements"),
    "freqs": (lambda a: a.update(freqs=a["freqs"][:, :32].contiguous()),
              r"freqs must be \[max_pos, 64\]"),
    "out_loc": (lambda a: a.update(out_loc=a["out_loc"].float()), r"out_loc must have dtype"),
    "kvcache": (lambda a: a.update(kvcache=a["kvcache"].float()), r"kvcache must have dtype"),
    "page_size": (lambda a: a.update(page_size=3), r"page_size must be a power of two"),
    "eps": (lambda a: a.update(eps=-1.0), r"eps \(norm_eps\) must be finite"),
    "dcp_rank": (lambda a: a.update(dcp_world_size=2, dcp_rank=2, dcp_interleave=1),
                 r"dcp_rank must be in \[0, dcp_world_size"),
    "kv_score_input": (lambda a: a.update(kv_score_input=a["kv_score_input"][:, :100]),
                       r"kv_score_input must have 2048 columns"),
    "is_online": (lambda a: a.update(is_online=True), r"is_online needs compress_ratio 128"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_input_names_the_op_and_argument(device, what):
    a, _ = _raw_args(device)
    a.update(layout="v4", dcp_world_size=1, dcp_rank=0, dcp_interleave=1)
    change, msg = BAD[what]
    change(a)
    with pytest.raises(RuntimeError, match=r"dsv4\.compress_and_store: " + msg):
        _call(a)
    with torch.device("meta"):  # the fake makes the same checks
        meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    if what != "out_is_cache":  # memory sharing needs addresses
        with pytest.raises(RuntimeError, match=r"dsv4\.compress_and_store: " + msg):
            _call(meta)


def test_python_errors_name_the_function(device):
    _, w = _raw_args(device)
    plan = plan_for(w, True)
    kw = dict(head_dim=512, norm_weight=w.norm_weight, norm_eps=1e-6, freq_cis=w.freqs,
              out_loc=w.out_loc, kvcache=random_cache(w, "fp8_ds_mla", "v4"),
              page_size=w.cache_page_size)
    with pytest.raises(ValueError, match=r"dsv4\.compress_and_store: compress_ratio=128 but the "
                                         r"plan was built for 4"):
        compress_and_store(w.state, w.kv_in, w.ape, plan, compress_ratio=128, **kw)
    with pytest.raises(TypeError, match=r"dsv4\.compress_and_store: plan must be a"):
        compress_and_store(w.state, w.kv_in, w.ape, list(plan), compress_ratio=4, **kw)
    with pytest.raises(ValueError, match=r"dsv4\.compress_and_store: use_fp4 needs head_dim 128"):
        compress_and_store(w.state, w.kv_in, w.ape, plan, compress_ratio=4, use_fp4=True, **kw)
    with pytest.raises(ValueError, match=r"dsv4\.compress_and_store: layout v41 needs head_dim "
                                         r"512 without use_fp4 or bf16_store"):
        compress_and_store(w.state, w.kv_in, w.ape, plan, compress_ratio=4, bf16_store=True,
                           layout="v41", **kw)


def test_debug_mode_names_the_op(device, debug_mode):
    """Debug mode (contract 7) checks the plan rows and destinations, naming the fused op."""
    a, w = _raw_args(device)
    a["out_loc"] = a["out_loc"] + 10 ** 6
    with pytest.raises(ValueError, match=r"dsv4\.compress_and_store: .*destination out_loc"):
        dsv4_ops.ops.compress_and_store_op(*a.values())
