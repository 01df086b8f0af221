"""Small, consistent argument sets for every dsv4 op (one paged world of a few requests),
shared by the opcheck, torch.compile and bad-input tests."""
from dataclasses import dataclass

import torch

from dsv4_ops import reference

FULL_PAGE = 64          # tokens per full-cache page (== SWA page size here)
NUM_REQ_ROWS = 4
MAX_CTX = 512


@dataclass
class World:
    device: torch.device
    compress_ratio: int
    head_dim: int
    ring: int
    rid: torch.Tensor
    req_to_token: torch.Tensor
    full_to_state: torch.Tensor
    seq_lens: torch.Tensor
    extend_lens: torch.Tensor
    state: torch.Tensor
    kv_in: torch.Tensor
    ape: torch.Tensor
    norm_weight: torch.Tensor
    freqs: torch.Tensor
    cache_page_size: int

    @property
    def num_q(self) -> int:
        return int(self.extend_lens.sum())

    def kvcache(self, store_format: str, pages: int = 8) -> torch.Tensor:
        nbytes = reference.page_bytes(store_format, self.cache_page_size)
        return torch.zeros((pages, nbytes), dtype=torch.uint8, device=self.device)

    def out_loc(self, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.int64, device=self.device) % (8 * self.cache_page_size)


def make_world(device, compress_ratio: int = 4, head_dim: int = 128,
               state_dtype=torch.float32, input_dtype=torch.float32, seed: int = 0) -> World:
    """Two requests at rows (2, 0) of a 4-row pool; every full page maps to a distinct,
    shuffled SWA page, so SWA-paged slots differ from request-ring slots."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(seed)
    cr, hd = compress_ratio, head_dim
    ring = 8 if cr == 4 else 128
    row = reference.row_len(cr, hd)
    seq, ext = ([13, 9], [13, 5]) if cr == 4 else ([300, 130], [300, 3])
    pages_per_row = MAX_CTX // FULL_PAGE
    full_pages = torch.randperm(NUM_REQ_ROWS * pages_per_row, generator=g)
    r2t = (full_pages.view(NUM_REQ_ROWS, pages_per_row, 1) * FULL_PAGE
           + torch.arange(FULL_PAGE)).view(NUM_REQ_ROWS, MAX_CTX).to(torch.int32)
    swa_pages = torch.randperm(NUM_REQ_ROWS * pages_per_row, generator=g)
    f2s = (swa_pages.view(-1, 1) * FULL_PAGE + torch.arange(FULL_PAGE)).view(-1)  # full page p -> swa page
    num_slots = NUM_REQ_ROWS * pages_per_row * ring if cr == 4 else NUM_REQ_ROWS * ring
    state = torch.randn((num_slots // cr, cr, row), generator=g).to(state_dtype)
    max_pos = 1024
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * (
        1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    freqs = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)
    return World(
        device=device, compress_ratio=cr, head_dim=hd, ring=ring,
        rid=torch.tensor([2, 0], dtype=torch.int64, device=device),
        req_to_token=r2t.to(device), full_to_state=f2s.to(torch.int64).to(device),
        seq_lens=torch.tensor(seq, dtype=torch.int64, device=device),
        extend_lens=torch.tensor(ext, dtype=torch.int64, device=device),
        state=state.to(device),
        kv_in=torch.randn((sum(ext), row), generator=g).to(input_dtype).to(device),
        ape=(0.5 * torch.randn((8 if cr == 4 else 128, hd), generator=g)).to(device),
        norm_weight=(1.0 + 0.1 * torch.randn((hd,), generator=g)).to(device),
        freqs=freqs.to(device),
        cache_page_size=max(1, 256 // cr),  # compressed-cache tokens per 256-token page
    )


def decode_world(device, **kw) -> World:
    """The same world one decode step later: one new token per request, closing a window."""
    w = make_world(device, **kw)
    cr = w.compress_ratio
    w.seq_lens = torch.tensor([16, 8] if cr == 4 else [384, 256], dtype=torch.int64, device=w.device)
    w.extend_lens = torch.ones_like(w.seq_lens)
    w.kv_in = w.kv_in[:2].contiguous()
    return w


def freqs_real(w: World) -> torch.Tensor:
    return torch.view_as_real(w.freqs).flatten(-2)
