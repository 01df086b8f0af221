"""compress_forward with a row-strided kv_score_input (docs/contract.md 3.4 "Input layout"): a
column slice of one wider projection output (the main and the indexer compressor's rows side by
side) or a padded row pitch is read in place, and the call writes the same bytes (out and
every state row) as the call with its contiguous copy, for every kernel: cr 4 hd 512 / 128,
cr 128 offline and online, decode and prefill, trimmed and padded plans, every state / input
dtype pair. Bad strides raise naming the op and the argument."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import Compressor, CompressorDecodePlan, CompressorPrefillPlan, kv_score_row_width
from dsv4_ops.testing import worlds

OP = torch.ops.dsv4.compress_forward
F32, BF16 = torch.float32, torch.bfloat16

# (compress_ratio, head_dim, online)
KERNELS = [(4, 512, False), (4, 128, False), (128, 512, False), (128, 128, False),
           (128, 512, True)]
KERNEL_IDS = [f"c{cr}-hd{hd}{'-online' if on else ''}" for cr, hd, on in KERNELS]
DTYPES = [(s, i) for s in (F32, BF16) for i in (F32, BF16)]
DTYPE_IDS = [f"s{str(s)[6:]}-i{str(i)[6:]}" for s, i in DTYPES]
# How this compressor's rows sit in a wider tensor: the first or the second compressor's
# columns of a [T, W + W_other] projection, or a padded pitch; odd_pitch (no whole 4-element
# vectors) works on the CPU and is refused on the GPU.
LAYOUTS = ["first", "second", "padded", "odd_pitch"]

PREFILL_REQUESTS = {4: [(37, 37), (300, 45), (21, 3), (64, 1), (9, 9)],
                    128: [(300, 300), (520, 150), (260, 5), (129, 2), (40, 40)]}


def other_width(hd):
    """Row width of the compressor beside this one in the projection (main hd 512 beside the
    indexer hd 128 and the other way round)."""
    return kv_score_row_width(4, 128 if hd == 512 else 512)


def strided_rows(rows: torch.Tensor, layout: str, hd: int, gen: torch.Generator):
    """(view, wide): a view with the values of `rows` [T, W] in a wider tensor whose other
    columns hold random values of the same dtype."""
    t, w = rows.shape
    start, width = {"first": (0, w + other_width(hd)),
                    "second": (other_width(hd), w + other_width(hd)),
                    "padded": (0, w + 64), "odd_pitch": (0, w + 3)}[layout]
    wide = torch.randn(t, width, generator=gen).to(rows.dtype).to(rows.device)
    view = wide[:, start:start + w]
    view.copy_(rows)
    assert view.stride() == (width, 1)
    return view, wide


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def state_for(device, cr, hd, online, sdt, num_requests, gen):
    comp = Compressor(cr, hd, addressing="online" if online else "legacy", state_dtype=sdt)
    state = comp.state_buffer(num_requests=num_requests)
    worlds.fill_state(state, "randn", gen, hd, online)
    return state.to(device)


def kv_rows(n, cr, hd, idt, device, gen):
    return worlds.kv_score_rows(n, cr, hd, gen, score_scale=2.0).to(idt).to(device)


def ape_for(cr, hd, device, gen):
    return (0.5 * torch.randn(dsv4_ops.window_size(cr), hd, generator=gen)).to(device)


def decode_call(device, cr, hd, online, sdt, idt, gen):
    """(state, input rows, ape, plan, plan_w=None): a decode step of a batch in which some
    requests close a window and some do not. On CUDA the batch is large enough for the grouped
    cr 128 decode blocks (a block per group of requests, c128_decode_groups)."""
    big = device.type == "cuda" and cr == 128
    batch = (160 if hd == 512 else 560) if big else 40
    g = torch.Generator().manual_seed(1000 + batch)
    k = torch.randint(1, 4, (batch,), generator=g)
    rest = torch.randint(1, cr, (batch,), generator=g)
    seq = torch.where(torch.arange(batch) % 2 == 0, k * cr, k * cr + rest)
    rid = torch.randperm(batch + 3, generator=g)[:batch]
    if online:
        plan = CompressorDecodePlan.generate_online(seq.to(device), rid.to(device),
                                                    torch.zeros(1, 1, dtype=torch.int32, device=device))
    else:
        plan = CompressorDecodePlan.generate_legacy(cr, rid.to(device), seq.to(device))
    state = state_for(device, cr, hd, online, sdt, batch + 3, gen)
    return state, kv_rows(batch, cr, hd, idt, device, gen), ape_for(cr, hd, device, gen), plan.plan_d, None


def prefill_call(device, cr, hd, online, sdt, idt, gen, padded):
    """(state, input rows, ape, plan_c, plan_w) of a prefill of requests with and without a
    prefix (windows that read state rows and input rows), legacy / online planners."""
    reqs = PREFILL_REQUESTS[cr]
    n = len(reqs)
    rid = torch.tensor([3, 0, 5, 1, 4][:n], dtype=torch.int64)
    seq = torch.tensor([s for s, _ in reqs], dtype=torch.int64)
    ext = torch.tensor([e for _, e in reqs], dtype=torch.int64)
    num_q = int(ext.sum())
    if online:
        plan = CompressorPrefillPlan.generate_online(seq, ext, rid.to(device),
                                                     torch.zeros(1, 1, dtype=torch.int32, device=device),
                                                     num_q, use_cuda_graph=padded)
    else:
        plan = CompressorPrefillPlan.generate_legacy(cr, rid, seq, ext, num_q, device,
                                                     use_cuda_graph=padded)
    state = state_for(device, cr, hd, online, sdt, 6, gen)
    return state, kv_rows(num_q, cr, hd, idt, device, gen), ape_for(cr, hd, device, gen), plan.plan_c, plan.plan_w


def assert_same_as_contiguous(device, cr, hd, online, call, layout, gen):
    """The call with `layout`'s strided view of the input writes the bytes of the call with the
    contiguous rows; the call pools and writes something (the comparison can fail)."""
    state, rows, ape, plan, plan_w = call
    view, wide = strided_rows(rows, layout, hd, gen)
    if layout == "odd_pitch" and device.type == "cuda":
        # a pitch of no whole 4-element vectors: refused on the GPU, not copied
        out = torch.empty(plan.shape[0], hd, dtype=rows.dtype, device=device)
        with pytest.raises(RuntimeError, match=r"dsv4\.compress_forward: kv_score_input must "
                                               r"have a row stride that is a multiple of 4"):
            OP(state.clone(), view, ape, plan, plan_w, out, hd, cr, online)
        return
    wide_before = wide.clone()
    outs, states = [], []
    for inp in (rows, view):
        st = state.clone()
        out = torch.empty(plan.shape[0], hd, dtype=rows.dtype, device=device)
        OP(st, inp, ape, plan, plan_w, out, hd, cr, online)
        outs.append(out)
        states.append(st)
    assert torch.equal(bits(outs[0]), bits(outs[1])), "out differs"
    assert torch.equal(bits(states[0]), bits(states[1])), "state rows differ"
    assert bool((outs[0] != 0).any()), "nothing pooled: the test proves nothing"
    assert not torch.equal(bits(states[0]), bits(state)), "no state row written"
    assert torch.equal(bits(wide_before), bits(wide)), "the op wrote into its input's tensor"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sdt,idt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cr,hd,online", KERNELS, ids=KERNEL_IDS)
def test_decode_strided_input(device, cr, hd, online, sdt, idt, layout):
    gen = torch.Generator().manual_seed(cr + hd)
    call = decode_call(device, cr, hd, online, sdt, idt, gen)
    assert_same_as_contiguous(device, cr, hd, online, call, layout, gen)


@pytest.mark.parametrize("padded", [False, True], ids=["trimmed", "padded"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sdt,idt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("cr,hd,online", KERNELS, ids=KERNEL_IDS)
def test_prefill_strided_input(device, cr, hd, online, sdt, idt, layout, padded):
    gen = torch.Generator().manual_seed(cr * hd)
    call = prefill_call(device, cr, hd, online, sdt, idt, gen, padded)
    assert_same_as_contiguous(device, cr, hd, online, call, layout, gen)


def test_both_compressors_of_one_projection(device):
    """The main (cr 4, hd 512) and the indexer (cr 4, hd 128) compressor read their column
    slices of one projection output, in place, through the Python API in debug mode (the plan
    validation accepts the views): the outputs and states of the contiguous calls."""
    gen = torch.Generator().manual_seed(7)
    reqs = PREFILL_REQUESTS[4]
    rid = torch.tensor([3, 0, 5, 1, 4], dtype=torch.int64)
    seq = torch.tensor([s for s, _ in reqs])
    ext = torch.tensor([e for _, e in reqs])
    num_q = int(ext.sum())
    plan = CompressorPrefillPlan.generate_legacy(4, rid, seq, ext, num_q, device)
    w_main, w_idx = kv_score_row_width(4, 512), kv_score_row_width(4, 128)
    proj = torch.randn(num_q, w_main + w_idx, generator=gen).to(device)
    dsv4_ops.set_debug(True)
    try:
        for hd, cols in ((512, slice(0, w_main)), (128, slice(w_main, w_main + w_idx))):
            state = state_for(device, 4, hd, False, F32, 6, gen)
            ape = ape_for(4, hd, device, gen)
            s_view, s_copy = state.clone(), state.clone()
            out_view = dsv4_ops.compress_forward(s_view, proj[:, cols], ape, plan, head_dim=hd,
                                                 compress_ratio=4)
            out_copy = dsv4_ops.compress_forward(s_copy, proj[:, cols].contiguous(), ape, plan,
                                                 head_dim=hd, compress_ratio=4)
            assert torch.equal(bits(out_view), bits(out_copy))
            assert torch.equal(bits(s_view), bits(s_copy))
            assert bool((out_copy != 0).any())
    finally:
        dsv4_ops.set_debug(False)


def test_out_in_the_gap_between_rows(device):
    """`out` may live between the input's rows (it shares no byte with them); touching a row
    is an error naming out and kv_score_input."""
    gen = torch.Generator().manual_seed(11)
    cr, hd = 4, 128
    state, rows, ape, plan, plan_w = prefill_call(device, cr, hd, False, F32, F32, gen, False)
    w, n = rows.shape[1], plan.shape[0]
    wide = torch.randn(rows.shape[0], w + n * hd, generator=gen).to(device)
    view = wide[:, :w]
    view.copy_(rows)
    out_gap = wide[0, w:w + n * hd].view(n, hd)
    st_gap, st_ref = state.clone(), state.clone()
    OP(st_gap, view, ape, plan, plan_w, out_gap, hd, cr, False)
    out_ref = torch.empty(n, hd, device=device)
    OP(st_ref, rows, ape, plan, plan_w, out_ref, hd, cr, False)
    assert torch.equal(bits(out_gap), bits(out_ref))
    assert torch.equal(bits(st_gap), bits(st_ref))
    out_touching = wide[0, w - 4:w - 4 + n * hd].view(n, hd)
    with pytest.raises(RuntimeError, match=r"dsv4\.compress_forward: out must not share memory "
                                           r"with kv_score_input"):
        OP(state.clone(), view, ape, plan, plan_w, out_touching, hd, cr, False)


def _decode_args(device, rows):
    """A decode call of cr 4 hd 128 with input `rows` (two batch entries)."""
    st = torch.zeros(2, 4, kv_score_row_width(4, 128), device=device)
    ape = torch.zeros(8, 128, device=device)
    plan = CompressorDecodePlan.generate_legacy(4, torch.tensor([0, 1], device=device),
                                                torch.tensor([4, 9], device=device)).plan_d
    return [st, rows, ape, plan, None, torch.zeros(2, 128, device=device), 128, 4, False]


W4 = kv_score_row_width(4, 128)
BAD_STRIDES = [
    ("column stride 2", lambda d: torch.zeros(2, 2 * W4, device=d)[:, ::2],
     r"must have contiguous rows \(column stride 1\)"),
    ("transposed", lambda d: torch.zeros(W4, 2, device=d).t(),
     r"must have contiguous rows \(column stride 1\)"),
    ("overlapping rows", lambda d: torch.zeros(3 * W4, device=d).as_strided((2, W4), (W4 // 2, 1)),
     r"must have a row stride of at least its row width 512 \(rows must not overlap\)"),
    ("expanded row", lambda d: torch.zeros(W4, device=d).expand(2, W4),
     r"must have a row stride of at least its row width 512"),
]


@pytest.mark.parametrize("what,make,msg", BAD_STRIDES, ids=[b[0] for b in BAD_STRIDES])
def test_bad_strides_raise(device, what, make, msg):
    args = _decode_args(device, torch.zeros(2, W4, device=device))
    OP(*args)  # the unmodified call is fine
    args[1] = make(device)
    with pytest.raises(RuntimeError, match=rf"dsv4\.compress_forward: kv_score_input {msg}"):
        OP(*args)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    meta[1] = make("meta")
    with pytest.raises(RuntimeError, match=rf"dsv4\.compress_forward: kv_score_input {msg}"):
        OP(*meta)  # the fake makes the same check


def test_fake_accepts_strided_rows():
    args = _decode_args("meta", torch.zeros(2, W4 + 512, device="meta")[:, 512:])
    OP(*args)


def test_kv_score_buffer_overlapping_a_row(device):
    args = _decode_args(device, None)
    flat = args[0].view(-1)
    args[1] = flat.as_strided((2, W4), (W4 + 4, 1), flat.numel() - 2 * W4 - 8)
    with pytest.raises(RuntimeError, match=r"dsv4\.compress_forward: kv_score_buffer must not "
                                           r"share memory with kv_score_input"):
        OP(*args)


def test_opcheck_strided_input(device):
    gen = torch.Generator().manual_seed(3)
    state, rows, ape, plan, plan_w = prefill_call(device, 4, 512, False, F32, F32, gen, True)
    view, _ = strided_rows(rows, "second", 512, gen)
    out = torch.empty(plan.shape[0], 512, device=device)
    torch.library.opcheck(OP, (state, view, ape, plan, plan_w, out, 512, 4, False))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_slices_of_one_projection(device, dynamic):
    """torch.compile(fullgraph=True) of both compressors' prefill from column slices of one
    projection output: the eager bytes."""
    gen = torch.Generator().manual_seed(5)
    reqs = PREFILL_REQUESTS[4]
    rid = torch.tensor([3, 0, 5, 1, 4], dtype=torch.int64, device=device)
    seq = torch.tensor([s for s, _ in reqs], device=device)
    ext = torch.tensor([e for _, e in reqs], device=device)
    num_q = int(ext.sum())
    w_main = kv_score_row_width(4, 512)
    proj = torch.randn(num_q, w_main + kv_score_row_width(4, 128), generator=gen).to(device)
    states = [state_for(device, 4, hd, False, F32, 6, gen) for hd in (512, 128)]
    apes = [ape_for(4, hd, device, gen) for hd in (512, 128)]

    def step(proj, s_main, s_idx, a_main, a_idx):
        plan = CompressorPrefillPlan.generate_legacy(4, rid, seq, ext, num_q, device,
                                                     use_cuda_graph=True)
        main = dsv4_ops.compress_forward(s_main, proj[:, :w_main], a_main, plan, head_dim=512,
                                         compress_ratio=4)
        idx = dsv4_ops.compress_forward(s_idx, proj[:, w_main:], a_idx, plan, head_dim=128,
                                        compress_ratio=4)
        return main, idx

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    eager_states = [s.clone() for s in states]
    comp_states = [s.clone() for s in states]
    eager = step(proj, *eager_states, *apes)
    got = compiled(proj, *comp_states, *apes)
    for a, b in zip(eager + tuple(eager_states), got + tuple(comp_states)):
        assert torch.equal(bits(a), bits(b))
    assert bool((eager[0] != 0).any()) and bool((eager[1] != 0).any())
