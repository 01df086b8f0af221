"""dsv4_ops: DeepSeek-V4 KV-cache compressor kernels as PyTorch custom operators.

    import dsv4_ops                       # registers torch.ops.dsv4.*
    state = dsv4_ops.state_buffer(4, 512, num_slots)       # buffers sized by dsv4_ops.layout
    cache = dsv4_ops.kv_cache("fp8_ds_mla", num_pages, page_size=64)
    plan = dsv4_ops.CompressorDecodePlan.generate(...)
    kv = dsv4_ops.compress_forward(state, kv_score, ape, plan, head_dim=512, compress_ratio=4)
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=w, norm_eps=1e-6, freq_cis=f,
                                      out_loc=loc, kvcache=cache, page_size=64)
    # or both in one op (the same bytes): dsv4_ops.compress_and_store(state, kv_score, ape,
    # plan, head_dim=512, compress_ratio=4, norm_weight=w, norm_eps=1e-6, freq_cis=f,
    # out_loc=loc, kvcache=cache, page_size=64)

V4.1's ratio-1 / ratio-2 compressors and stores (dsv4_ops.low_ratio) take the reference
engine's signatures: `c1_decode_norm_rope_store`, `c2_decode_norm_rope_store`,
`c2_prefill_norm_rope_store`, `fused_store_cache`, `index_k_norm_rope_pack_store`.

The speculative-decoding ops of the online cr = 128 state (dsv4_ops.spec) take the reference
engine's signatures too: `online_c128_mtp_write_prefix_states`, `online_c128_mtp_mark_pending`,
`online_c128_mtp_commit_pending`.

`dsv4_ops.testing` holds the plain-PyTorch oracle (`dsv4_ops.testing.reference`), the
simulated serving engine and the builder of test worlds; `dsv4_ops.distributed` the
context-parallel prefill over torch.distributed (`cp_compress`). Both are imported on demand.
Decode context parallelism: every store takes `dcp_world_size`, `dcp_rank`, `dcp_interleave`
and writes only this rank's share of the cache (`dcp_local_slot`, `dcp_local_pages`).
"""
from . import ops
from .compressor import (compress_and_store, compress_forward, compress_norm_rope_store,
                         store_format_of)
from .layout import (STORE_FORMATS, Compressor, KVLayout, StoreFormat, cache_page_bytes,
                     dcp_local_pages, dcp_local_slot, is_valid_kv_layout_pair, kv_cache,
                     kv_score_row_width, pair_ring_size, state_buffer, state_row_width,
                     state_slots, window_size)
from .low_ratio import (c1_decode_norm_rope_store, c2_decode_norm_rope_store,
                        c2_prefill_norm_rope_store, fused_store_cache,
                        index_k_norm_rope_pack_store, low_ratio_out_loc)
from .plans import CompressorDecodePlan, CompressorPrefillPlan
from . import spec
from .spec import (max_verify_tokens, online_c128_mtp_commit_pending,
                   online_c128_mtp_mark_pending, online_c128_mtp_write_prefix_states)
from .validate import set_debug, validate_compress, validate_store

__all__ = [
    "ops", "CompressorDecodePlan", "CompressorPrefillPlan", "compress_forward",
    "compress_norm_rope_store", "compress_and_store", "store_format_of", "set_debug", "validate_compress",
    "validate_store", "STORE_FORMATS", "Compressor", "StoreFormat", "cache_page_bytes",
    "kv_cache", "kv_score_row_width", "state_buffer", "state_row_width", "state_slots",
    "window_size", "KVLayout", "is_valid_kv_layout_pair", "pair_ring_size",
    "c1_decode_norm_rope_store", "c2_decode_norm_rope_store", "c2_prefill_norm_rope_store",
    "fused_store_cache", "index_k_norm_rope_pack_store", "low_ratio_out_loc",
    "spec", "max_verify_tokens", "online_c128_mtp_write_prefix_states",
    "online_c128_mtp_mark_pending", "online_c128_mtp_commit_pending",
    "dcp_local_slot", "dcp_local_pages",
]
from ._library import VERSION as __version__  # pyproject.toml's version, as the build recorded it
