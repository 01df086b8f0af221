"""Small, consistent argument sets for every dsv4 op (one paged world of a few requests from
dsv4_ops.testing.worlds), shared by the opcheck, torch.compile and bad-input tests."""
import torch

import dsv4_ops
from dsv4_ops import Compressor
from dsv4_ops.testing import worlds

SWA_PAGE = 64           # tokens per SWA page (== full-cache page here)


def output_buffer(shape, device):
    """An output argument filled with a value no op writes: torch.empty may hand back the memory
    of an earlier launch's output holding the same bytes, hiding whether this launch wrote."""
    return torch.full(shape, -1234.5, device=device)


def make_world(device, compress_ratio: int = 4, head_dim: int = 128,
               state_dtype=torch.float32, input_dtype=torch.float32, seed: int = 0
               ) -> worlds.World:
    """Two requests at rows (2, 0) of a 4-row pool whose rows are all mapped; every full page
    maps to a distinct, shuffled SWA page, so SWA-paged slots differ from request-ring slots.
    The state holds random rows."""
    seq, ext = ([13, 9], [13, 5]) if compress_ratio == 4 else ([300, 130], [300, 3])
    return _world(device, compress_ratio, head_dim, state_dtype, input_dtype, seed,
                  list(zip(seq, ext)))


def decode_world(device, **kw) -> worlds.World:
    """The same pool one decode step later: one new token per request, closing a window."""
    cr = kw.get("compress_ratio", 4)
    seq = [16, 8] if cr == 4 else [384, 256]
    kw.setdefault("compress_ratio", cr)
    return _world(device, requests=[(s, 1) for s in seq], **kw)


def _world(device, compress_ratio=4, head_dim=128, state_dtype=torch.float32,
           input_dtype=torch.float32, seed=0, requests=()):
    return worlds.make_world(
        device, Compressor(compress_ratio, head_dim, state_dtype=state_dtype), requests,
        rids=[2, 0], num_req_rows=4, page_size=SWA_PAGE, max_context=512, map_all_rows=True,
        cache_page_size=max(1, 256 // compress_ratio), state_fill="randn",
        input_dtype=input_dtype, seed=seed)


# ---- the V4.1 ops (contract V4.1 4.2) ----------------------------------------------------------

def low_ratio_samples(device):
    """name -> (op, args) of every V4.1 op and of compress_norm_rope_store with a V41 layout:
    small argument sets on `device` whose every launch writes something (random ring, cache and
    latent bytes; positions inside freqs; slots inside the caches)."""
    import low_ratio_cases as lr
    from dsv4_ops import KVLayout

    ops = torch.ops.dsv4
    g = lr.gen(99)
    dev = torch.device(device)
    ps, hd = 64, lr.HD
    freqs = lr.random_freqs(64, g).to(dev)
    w = lr.norm_weight(g).to(dev)
    w128 = lr.norm_weight(g, lr.INDEX_DIM).to(dev)

    def cache(layout):
        return lr.cache_for(layout, 2, ps, g).to(dev)

    def idx(values):
        return torch.tensor(values, dtype=torch.int64, device=dev)

    def latent(n):
        return lr.random_bytes((n, hd), g, torch.bfloat16).to(dev)

    ring = 4
    state = lr.random_bytes((3 * ring + 2, 2 * hd), g, torch.float32).to(dev)
    kv_score = lr.kv_score_rows(4, g).to(dev)
    samples = {
        "c1_norm_rope_store": (ops.c1_norm_rope_store, (
            lr.kv_rows(6, g).to(dev), w, lr.EPS, freqs, idx([0, 5, 9, 2, 63, 7]),
            idx([3, 0, 70, 8, -1, 127]), cache(KVLayout.V41), ps, "v41", latent(6))),
        "c2_decode": (ops.c2_norm_rope_store, (
            kv_score, state.clone(), w, lr.EPS, freqs, idx([1, 2, 5, 0]), idx([0, 1, 2, 1]),
            idx([3, 4, 11, 0]), cache(KVLayout.V41_FP4), ps, ring, 1, "v41_fp4", latent(4))),
        "c2_verify": (ops.c2_norm_rope_store, (
            kv_score, state.clone(), w, lr.EPS, freqs, idx([3, 4, 6, 7]), idx([0, 0, 2, 2]),
            idx([7, 8, 20, 21]), cache(KVLayout.V41_NEW), ps, ring, 2, "v41_new", latent(4))),
        "c2_prefill": (ops.c2_prefill_norm_rope_store, (
            kv_score, state.clone(), w, lr.EPS, freqs, idx([0, 1, 2, 5]), idx([0, 0, 0, 2]),
            idx([2, 3, 4, 11]), torch.tensor([0, 3], dtype=torch.int32, device=dev),
            torch.tensor([3, 1], dtype=torch.int32, device=dev), cache(KVLayout.UNIFORM_FP8),
            ps, ring, "uniform_fp8", latent(4))),
        "low_ratio_index_k_store": (ops.low_ratio_index_k_store, (
            lr.kv_rows(5, g, lr.INDEX_DIM).to(dev), w128, lr.EPS, freqs, idx([1, 3, 4, 7, 9]),
            idx([5, -1, 0, 66, 3]), lr.random_bytes((2, 68 * ps), g).to(dev), ps, 2)),
        "kv_store_rope": (ops.kv_store, (
            lr.kv_rows(3, g).to(dev), idx([1, 70, -1]), lr.random_freqs(3, g).to(dev),
            cache(KVLayout.V41_FP4_NEW), ps, "v41_fp4_new")),
        "kv_store_v4": (ops.kv_store, (
            torch.randn(3, hd, generator=g).to(dev), idx([0, 9, 100]), None, cache(KVLayout.V4),
            ps, "v4")),
    }
    d = decode_world(dev, compress_ratio=4, head_dim=hd)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, d.rid, d.req_to_token, d.full_to_state,
                                                  d.seq_lens, SWA_PAGE, d.ring)
    samples["compress_norm_rope_store_v41"] = (ops.compress_norm_rope_store, (
        torch.randn(2, hd, generator=g).to(dev), plan.plan_d, torch.ones(hd, device=dev),
        d.freqs_real, d.out_loc,
        lr.cache_for(KVLayout.V41, d.num_pages, d.cache_page_size, g).to(dev),
        True, 4, 1e-6, d.cache_page_size, "fp8_ds_mla", "v41"))
    # Decode-context-parallel stores (contract 9): (W, rank, I) chosen so that the rank owns a
    # stored entry of the sample (c1: global 3 -> local 1; c2: 1, 5 -> 0, 1; verify: 3, 10 ->
    # 1, 4; prefill: 1, 5 -> 0, 2; index-K: 66 -> 22; kv_store: 100 -> 36; the V4.0 store: the
    # owner of its first row's entry, which closes a window).
    for name, dcp in (("c1_norm_rope_store", (2, 1, 1)), ("c2_decode", (4, 1, 1)),
                      ("c2_verify", (2, 1, 2)), ("c2_prefill", (2, 1, 1)),
                      ("low_ratio_index_k_store", (3, 0, 2)), ("kv_store_v4", (4, 1, 64))):
        op, args = samples[name]
        samples[f"{name}_dcp"] = (op, tuple(a.clone() if isinstance(a, torch.Tensor) else a
                                            for a in args) + dcp)
    samples["compress_norm_rope_store_dcp"] = (ops.compress_norm_rope_store, (
        torch.randn(2, hd, generator=g).to(dev), plan.plan_d, torch.ones(hd, device=dev),
        d.freqs_real, d.out_loc, lr.cache_for(KVLayout.V4, d.num_pages, d.cache_page_size,
                                              g).to(dev),
        True, 4, 1e-6, d.cache_page_size, "fp8_ds_mla", "v4", 2,
        int(d.out_loc[0]) % 2, 1))
    return samples


# ---- context-parallel prefill (contract 8) ------------------------------------------------------

def cp_samples(device):
    """name -> (op, args) of compress_partials (ratio 4 and 128: the rank that reads the state,
    holding the even ragged rows, and a rank holding the odd ones) and merge_partials (into rows,
    and into one partial against a bare max): small argument sets on `device` whose every launch
    writes something."""
    from dsv4_ops.distributed import ContextParallelPlan

    ops = torch.ops.dsv4
    dev = torch.device(device)
    samples = {}
    for cr, hd, rank in ((4, 128, 0), (128, 512, 1)):
        w = make_world(dev, compress_ratio=cr, head_dim=hd)
        plan = dsv4_ops.CompressorPrefillPlan.generate(
            cr, w.rid, w.seq_lens_cpu, w.extend_lens_cpu, w.req_to_token, w.full_to_state,
            SWA_PAGE, w.ring, w.num_q, use_req_ring=cr == 128)
        mine = torch.arange(rank, w.num_q, 2, device=dev)
        cp = ContextParallelPlan.generate(plan, mine, w.num_q, read_state=rank == 0)
        samples[f"compress_partials_c{cr}"] = (ops.compress_partials, (
            w.state, w.kv_in[mine].contiguous(), cp.input_rows, w.ape, cp.plan_c, cp.plan_w,
            output_buffer((3, cp.plan_c.shape[0], hd), dev),
            output_buffer((cp.plan_w.shape[0], w.kv_score_row_width), dev), hd, cr,
            cp.read_state))
    g = torch.Generator().manual_seed(7)
    ranks, windows, hd = 3, 5, 128
    partials = torch.randn(ranks, 3, windows, hd, generator=g)
    partials[:, 1].abs_().add_(0.5)          # s > 0
    partials[1, 0, :2] = float("-inf")       # rank 1 holds no row of windows 0 and 1
    partials[1, 1:, :2] = 0.0
    partials = partials.to(dev)
    samples["merge_partials_rows"] = (ops.merge_partials, (
        partials, None, output_buffer((windows, hd), dev)))
    samples["merge_partials_rebase"] = (ops.merge_partials, (
        partials[:1].contiguous(), partials[:, 0].amax(0).contiguous(),
        output_buffer((3, windows, hd), dev)))
    return samples


# ---- speculative decoding (contract 10) ---------------------------------------------------------

def spec_samples(device):
    """name -> (op, args) of the online cr 128 draft ops: staging (fp32 and bf16 state, a chunk
    closing inside the verify), mark and commit (every entry commits something)."""
    ops = torch.ops.dsv4
    dev = torch.device(device)
    g = torch.Generator().manual_seed(11)
    hd, B, D, stride = 128, 3, 4, 5
    samples = {}
    seq = torch.tensor([3, 126, 200], device=dev)
    req = torch.tensor([1, 0, 4], device=dev)
    r2t = torch.zeros(stride, 4, dtype=torch.int32, device=dev)
    for dtype in (torch.float32, torch.bfloat16):
        state = torch.randn(stride * (D + 1), 3 * hd, generator=g)
        state[:, hd:2 * hd].abs_().add_(0.5)
        samples[f"write_prefix_states_{str(dtype).split('.')[-1]}"] = (
            ops.online_c128_mtp_write_prefix_states, (
                torch.randn(B * D, 2 * hd, generator=g).to(dev), seq, req, r2t,
                torch.randn(128, hd, generator=g).to(dev), state.to(dev, dtype), B, D, stride,
                hd))
    samples["mark_pending"] = (ops.online_c128_mtp_mark_pending, (
        seq, req, torch.zeros(stride, dtype=torch.int64, device=dev), B, stride))
    pending = torch.full((stride,), -1, dtype=torch.int64, device=dev)
    pending[req] = seq
    samples["commit_pending"] = (ops.online_c128_mtp_commit_pending, (
        seq + torch.tensor([1, 2, 3], device=dev), req, r2t, pending,
        torch.randn(stride * (D + 1), 3 * hd, generator=g).to(dev), B, D, stride, stride, hd))
    return samples


# ---- compress_and_store (contract 11) -----------------------------------------------------------

def fused_samples(device):
    """name -> (op, args) of compress_and_store: decode (c4 indexer fp4 without `out`, c128 main
    fp8_ds_mla with `out`, online c128 into a V4.1 layout, a DCP rank that owns a stored entry)
    and padded prefill (c4 main, c128 indexer), each step closing a window (the online one in
    one of its two requests)."""
    ops = torch.ops.dsv4
    dev = torch.device(device)
    samples = {}

    def decode(name, cr, hd, fmt, with_out, layout="v4", dcp=(), online=False):
        w = decode_world(dev, compress_ratio=cr, head_dim=hd)
        state = w.state
        if online:
            # A step that closes a window stores no online state: the second request's token
            # falls inside its window, so the step writes the state too.
            state = dsv4_ops.state_buffer(128, hd, 4, is_online=True, device=dev)
            seq_lens = w.seq_lens + torch.tensor([0, 5], dtype=w.seq_lens.dtype, device=dev)
            plan = dsv4_ops.CompressorDecodePlan.generate_online(seq_lens, w.rid,
                                                                 w.req_to_token)
        else:
            plan = dsv4_ops.CompressorDecodePlan.generate(cr, w.rid, w.req_to_token,
                                                          w.full_to_state, w.seq_lens, SWA_PAGE,
                                                          w.ring)
        out = output_buffer((2, hd), dev) if with_out else None
        samples[name] = (ops.compress_and_store, (
            state, w.kv_in, w.ape, plan.plan_d, None, w.norm_weight, w.freqs_real, w.out_loc,
            _fused_cache(w, fmt, layout), out, hd, cr, online, 1e-6, w.cache_page_size, fmt,
            layout) + (dcp if dcp else ()))
        return w

    decode("decode_c4_fp4", 4, 128, "fp4_indexer", False)
    decode("decode_c128_out", 128, 512, "fp8_ds_mla", True)
    decode("decode_online_v41", 128, 512, "fp8_ds_mla", False, layout="v41", online=True)
    w = decode_world(dev, compress_ratio=4, head_dim=512)
    decode("decode_c4_dcp", 4, 512, "fp8_ds_mla", False, dcp=(2, int(w.out_loc[0]) % 2, 1))
    for name, cr, hd, fmt in (("prefill_c4", 4, 512, "fp8_ds_mla"),
                              ("prefill_c128", 128, 128, "fp8_indexer")):
        w = make_world(dev, compress_ratio=cr, head_dim=hd)
        plan = dsv4_ops.CompressorPrefillPlan.generate(
            cr, w.rid, w.seq_lens_cpu, w.extend_lens_cpu, w.req_to_token, w.full_to_state,
            SWA_PAGE, w.ring, w.num_q + 3, use_cuda_graph=True, use_req_ring=cr == 128)
        kv_in = torch.cat([w.kv_in, torch.zeros_like(w.kv_in[:3])])
        out_loc = torch.cat([w.out_loc, torch.full((3,), -1, dtype=w.out_loc.dtype, device=dev)])
        samples[name] = (ops.compress_and_store, (
            w.state, kv_in, w.ape, plan.plan_c, plan.plan_w, w.norm_weight, w.freqs_real, out_loc,
            _fused_cache(w, fmt, "v4"), output_buffer((w.num_q + 3, hd), dev), hd, cr,
            False, 1e-6, w.cache_page_size, fmt))
    return samples


def _fused_cache(w, fmt, layout):
    from dsv4_ops import KVLayout
    if layout == "v4":
        return w.kvcache(fmt, pages=w.num_pages)
    return torch.zeros((w.num_pages, KVLayout.parse(layout).page_bytes(w.cache_page_size)),
                       dtype=torch.uint8, device=w.device)
