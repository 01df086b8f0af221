import torch
import dsv4_ops
from dsv4_ops.testing import reference  # the plain-PyTorch oracle, to check the result

dev = "cuda" if torch.cuda.is_available() else "cpu"
cr, hd = 4, 512     # the ratio-4 main compressor (windows of 8 rows, pooled every 4 tokens)
ring, page = 8, 64  # a state ring of 8 rows per request; 64-token pages
fmt = dsv4_ops.store_format_of(hd)  # "fp8_ds_mla" cache entries

# Buffers: the state ring of 2 request rows, and a compressed cache (a full page of 64 tokens
# makes 16 compressed tokens: cache page i holds those of full page i).
state = dsv4_ops.state_buffer(cr, hd, dsv4_ops.state_slots(
    "req_ring", compress_ratio=cr, ring_size=ring, num_requests=2), device=dev)
cache = dsv4_ops.kv_cache(fmt, num_pages=2, page_size=page // cr, device=dev)

# Inputs: 24 tokens of request row 1 (their kv_score rows), the weights and the page table.
torch.manual_seed(0)
rows = torch.randn(24, dsv4_ops.kv_score_row_width(cr, hd)).to(dev)
ape = torch.randn(dsv4_ops.window_size(cr), hd).to(dev)
norm_w = torch.ones(hd, device=dev)  # RMSNorm weight
angles = torch.arange(64.0)[:, None] * 10000 ** (-torch.arange(0, 64, 2) / 64)
freqs = torch.polar(torch.ones_like(angles), angles).to(dev)  # RoPE table, complex [64, 32]
rid = torch.tensor([1], device=dev)
req_to_token = torch.arange(2 * page, dtype=torch.int32, device=dev).view(2, page)
full_to_state = torch.arange(2 * page, device=dev)  # (read by SWA-paged state only)
pos = torch.arange(24, device=dev)
out_loc = torch.where((pos + 1) % cr == 0, req_to_token[1, pos] // cr, -1)  # where a window closes
table = dict(req_to_token=req_to_token, full_to_state=full_to_state, swa_page_size=page,
             ring_size=ring, use_req_ring=True)
store = dict(norm_weight=norm_w, norm_eps=1e-6, freq_cis=freqs, kvcache=cache, page_size=page // cr)

# Prefill the first 23 tokens (5 windows close), then decode token 24 (the 6th closes).
plan = dsv4_ops.CompressorPrefillPlan.generate(cr, rid, torch.tensor([23]), torch.tensor([23]),
                                               num_q_tokens=23, **table)
kv = dsv4_ops.compress_forward(state, rows[:23], ape, plan, head_dim=hd, compress_ratio=cr)
dsv4_ops.compress_norm_rope_store(kv, plan, out_loc=out_loc[:23], **store)
plan = dsv4_ops.CompressorDecodePlan.generate(cr, rid, seq_lens=pos[23:] + 1, **table)
kv_last = dsv4_ops.compress_forward(state, rows[23:], ape, plan, head_dim=hd, compress_ratio=cr)
dsv4_ops.compress_norm_rope_store(kv_last, plan, out_loc=out_loc[23:], **store)

# Check against the oracle: the 6 compressed tokens from the whole sequence, and the cache
# bytes of the oracle's store of them (RoPE at each window's first position).
got = torch.cat([kv, kv_last]).cpu()
want = reference.compressed_tokens(rows.cpu(), ape.cpu(), cr, hd)
torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
expected = torch.zeros_like(cache.cpu())
reference.store(expected, got, pos[3::4].cpu() - 3, out_loc[3::4].cpu(), norm_w.cpu(), 1e-6,
                freqs.cpu(), fmt, page // cr)
assert torch.equal(cache.cpu(), expected)
print(f"quickstart on {dev}: 6 compressed tokens stored, equal to the reference")
