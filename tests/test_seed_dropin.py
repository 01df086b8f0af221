"""Drop-in check: the reference engine's consumer code (its compressor_v2.py, named by the
environment variable DSV4_SEED, read at test time, never copied) runs on dsv4_ops by changing
its one kernel import, and its compressor step writes exactly the state and cache bytes that
direct dsv4_ops calls write, which in turn hold the reference's compressed tokens."""
import os
import sys
import types
from pathlib import Path

import pytest
import torch

import dsv4_ops
from dsv4_ops.testing import reference, worlds

SEED = os.environ.get("DSV4_SEED")
KERNEL_IMPORT = "from sglang.jit_kernel.dsv4 import ("

SPS, PAGE = 256, 256  # SWA page and full-cache page, in tokens


class _Flag:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


@pytest.fixture(scope="module")
def seed_module():
    if not SEED:
        pytest.skip("DSV4_SEED is not set (the path of the reference engine's compressor_v2.py)")
    if not Path(SEED).is_file():
        pytest.skip(f"DSV4_SEED names {SEED}, which is not a file")
    source = Path(SEED).read_text()
    assert source.count(KERNEL_IMPORT) == 1
    source = source.replace(KERNEL_IMPORT, "from dsv4_ops import (")  # the one changed import
    envs = types.SimpleNamespace(SGLANG_OPT_USE_ONLINE_COMPRESS=_Flag(False),
                                 SGLANG_OPT_USE_JIT_NORM=_Flag(True),
                                 SGLANG_OPT_USE_FUSED_STORE_CACHE=_Flag(False))
    stubs = {  # only what the seed imports besides the kernels: engine utilities
        "sglang": types.ModuleType("sglang"),
        "sglang.jit_kernel": types.ModuleType("sglang.jit_kernel"),
        "sglang.jit_kernel.utils": types.SimpleNamespace(is_hip_runtime=lambda: False),
        "sglang.srt": types.ModuleType("sglang.srt"),
        "sglang.srt.environ": types.SimpleNamespace(envs=envs),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        module = types.ModuleType("seed_compressor_v2")
        exec(compile(source, SEED, "exec"), module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    module._test_envs = envs
    return module


def _pool(full_to_state, ring):
    return types.SimpleNamespace(swa_page_size=SPS, full_to_swa_index_mapping=full_to_state,
                                 get_ring_size=lambda compress_ratio: ring)


def _world(device, cr, hd, lens, seed):
    """Requests prefilled from scratch on random rows of a pool with two spare rows."""
    return worlds.make_world(device, dsv4_ops.Compressor(cr, hd), [(n, n) for n in lens],
                             page_size=PAGE, swa_page_size=SPS, seed=seed)


@pytest.mark.parametrize("cr,hd,fp4", [(4, 128, False), (4, 128, True), (128, 512, False)])
def test_seed_step_runs_on_dsv4_ops(seed_module, device, cr, hd, fp4):
    lens = [13, 9, 300] if cr == 4 else [300, 130, 256]
    w = _world(device, cr, hd, lens, seed=cr + hd + fp4)
    seq = torch.tensor(lens, device=device)
    fmt = dsv4_ops.store_format_of(hd, use_fp4=fp4)
    ps = w.cache_page_size
    cache = w.kvcache(fmt)
    out_loc = w.out_loc
    norm = types.SimpleNamespace(weight=w.norm_weight, variance_epsilon=1e-6)
    freqs = w.freqs

    # The engine's own code path, on dsv4_ops.
    plan = seed_module.create_paged_compressor_data(
        cr, is_prefill=True, token_to_kv_pool=_pool(w.full_to_state, w.ring), req_to_token=w.req_to_token,
        req_pool_indices=w.rid, seq_lens=seq, extend_lens=seq, seq_lens_cpu=lens,
        extend_lens_cpu=lens)
    assert isinstance(plan, dsv4_ops.CompressorPrefillPlan)
    backend = seed_module.CompressorBackendMixin()
    backend.forward_metadata = types.SimpleNamespace(**{f"c{cr}_compress_metadata": plan})
    state_seed, cache_seed = w.state.clone(), cache.clone()
    backend._forward_compress_all_in_one(
        kv_score_buffer=state_seed, kv_score_input=w.kv_in, ape=w.ape, head_dim=hd, norm=norm,
        freqs_cis_cache=freqs, kv_cache=cache_seed, is_indexer=hd == 128, rotate=hd == 128,
        compress_ratio=cr, page_size=ps, out_loc=out_loc, use_fp4_indexer=fp4)

    # The same step through dsv4_ops directly.
    state_direct, cache_direct = w.state.clone(), cache.clone()
    direct = dsv4_ops.CompressorPrefillPlan.generate(cr, w.rid, seq.cpu(), seq.cpu(), w.req_to_token,
                                                     w.full_to_state, SPS, w.ring, sum(lens))
    kv = dsv4_ops.compress_forward(state_direct, w.kv_in, w.ape, direct, head_dim=hd,
                                   compress_ratio=cr)
    dsv4_ops.compress_norm_rope_store(kv, direct, norm_weight=norm.weight, norm_eps=1e-6,
                                      freq_cis=freqs, out_loc=out_loc, kvcache=cache_direct,
                                      page_size=ps, use_fp4=fp4)
    assert torch.equal(state_seed, state_direct)
    assert torch.equal(cache_seed, cache_direct)

    # ... and those are the reference's compressed tokens, stored where out_loc says.
    starts = [0] + torch.tensor(lens).cumsum(0).tolist()
    want = torch.cat([reference.compressed_tokens(w.kv_in[a:b].cpu(), w.ape.cpu(), cr, hd)
                      for a, b in zip(starts, starts[1:])])
    torch.testing.assert_close(kv.double().cpu(), want, rtol=1e-5, atol=1e-5)
    written = int((cache_seed != 0).any(dim=1).sum())
    assert written > 0 and int((w.out_loc_cpu >= 0).sum()) == kv.shape[0]


@pytest.mark.parametrize("cr", [4, 128])
def test_seed_decode_and_online_planning_on_dsv4_ops(seed_module, device, cr):
    lens = [16, 9, 300]
    w = _world(device, cr, 128, lens, seed=cr)
    seq = torch.tensor(lens, device=device)
    pool = _pool(w.full_to_state, w.ring)
    plan = seed_module.create_paged_compressor_data(
        cr, is_prefill=False, token_to_kv_pool=pool, req_to_token=w.req_to_token,
        req_pool_indices=w.rid.to(torch.int32), seq_lens=seq.to(torch.int32))
    direct = dsv4_ops.CompressorDecodePlan.generate(cr, w.rid, w.req_to_token, w.full_to_state, seq, SPS, w.ring)
    assert plan.is_decode and plan.compress_ratio == cr
    assert torch.equal(plan.plan_d, direct.plan_d)
    # docs/contract.md 3.2 for the new token of each request, computed here from the tables.
    words = plan.plan_d.view(torch.int32).cpu()
    for b, n in enumerate(lens):
        kw = dict(compress_ratio=cr, ring_size=w.ring, swa_page_size=SPS,
                  req_to_token=w.req_to_token_cpu, full_to_state=w.full_to_state_cpu)
        mode = "swa_paged" if cr == 4 else "req_ring"
        slot = reference.state_slot(mode, int(w.rid[b]), n - 1, **kw)
        prev = reference.state_slot(mode, int(w.rid[b]), max(n - 1 - cr, 0), **kw)
        assert words[b].tolist() == [n, slot, prev // cr, slot // cr]
    if cr == 128:  # the engine's online switch routes to the online planners
        seed_module._test_envs.SGLANG_OPT_USE_ONLINE_COMPRESS.value = True
        try:
            online = seed_module.create_paged_compressor_data(
                cr, is_prefill=True, token_to_kv_pool=pool, req_to_token=w.req_to_token,
                req_pool_indices=w.rid, seq_lens=seq, extend_lens=seq, seq_lens_cpu=lens,
                extend_lens_cpu=lens, online_state_slot_offset=2)
        finally:
            seed_module._test_envs.SGLANG_OPT_USE_ONLINE_COMPRESS.value = False
        closing = [(n // 128) for n in lens]
        assert online.plan_c.shape[0] == sum(closing)
        assert online.plan_w.shape[0] == sum(1 for n in lens if n % 128)
        c = online.plan_c.view(torch.int32).cpu()
        assert (c[:, 2] == c[:, 3] + 2).all()  # read_page_0 = rid + offset, read_page_1 = rid
