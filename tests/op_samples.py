"""Small, consistent argument sets for every dsv4 op (one paged world of a few requests from
dsv4_ops.testing.worlds), shared by the opcheck, torch.compile and bad-input tests."""
import torch

from dsv4_ops import Compressor
from dsv4_ops.testing import worlds

SWA_PAGE = 64           # tokens per SWA page (== full-cache page here)


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
