"""dsv4_ops: DeepSeek-V4 KV-cache compressor kernels as PyTorch custom operators.

    import dsv4_ops                       # registers torch.ops.dsv4.*
    plan = dsv4_ops.CompressorDecodePlan.generate(...)
    kv = dsv4_ops.compress_forward(state, kv_score, ape, plan, head_dim=512, compress_ratio=4)
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=w, norm_eps=1e-6, freq_cis=f,
                                      out_loc=loc, kvcache=cache, page_size=64)

`dsv4_ops.reference` holds the plain-PyTorch oracle (imported on demand).
"""
from . import ops
from .compressor import compress_forward, compress_norm_rope_store, store_format_of
from .plans import CompressorDecodePlan, CompressorPrefillPlan
from .validate import set_debug, validate_compress, validate_store

__all__ = [
    "ops", "CompressorDecodePlan", "CompressorPrefillPlan", "compress_forward",
    "compress_norm_rope_store", "store_format_of", "set_debug", "validate_compress",
    "validate_store",
]
from ._library import VERSION as __version__  # pyproject.toml's version, as the build recorded it
