"""Smoke test of an installed dsv4_ops (scripts/check_wheel.sh runs it in the environment the
wheel went into): the package is that environment's copy, every op has a CPU kernel, and one
128-token window is pooled and stored. With zero scores and ape the window's softmax weights
are equal, so the compressed token is the mean of its kv rows; with a RoPE table of angle 0
the bf16 store holds its RMSNorm, and nothing else in the cache changes."""
import sys

import torch

import dsv4_ops
from dsv4_ops import _library

assert dsv4_ops.__file__.startswith(sys.prefix), f"not the installed copy: {dsv4_ops.__file__}"
missing = [op for op in _library.OP_NAMES if not _library.has_kernel(op, "CPU")]
assert not missing, f"ops without a CPU kernel: {missing}"

hd, cr, page_size, eps = 512, 128, 2, 1e-6
g = torch.Generator().manual_seed(0)
kv_in = torch.zeros((cr, 2 * hd))                        # rows kv | score
kv_in[:, :hd] = torch.randn((cr, hd), generator=g)
one = torch.tensor([cr])
plan = dsv4_ops.CompressorPrefillPlan.generate_legacy(cr, torch.tensor([0]), one, one, cr, "cpu")
kv = dsv4_ops.compress_forward(torch.zeros((2, cr, 2 * hd)), kv_in, torch.zeros((cr, hd)), plan,
                               head_dim=hd, compress_ratio=cr)
mean = kv_in[:, :hd].double().mean(0)
assert torch.allclose(kv[0].double(), mean, rtol=1e-5, atol=1e-6), "compress_forward"

out_loc = torch.full((cr,), -1)   # per token: only the window's last token makes one
out_loc[cr - 1] = 3
cache = torch.zeros((4, 2 * page_size * hd), dtype=torch.uint8)   # bf16: 2 bytes per element
dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=torch.ones(hd), norm_eps=eps,
                                  freq_cis=torch.ones((1024, 32), dtype=torch.complex64),
                                  out_loc=out_loc, kvcache=cache, page_size=page_size,
                                  bf16_store=True)
stored = cache.view(4 * page_size, 2 * hd)[3].view(torch.bfloat16).double()
normed = mean * torch.rsqrt(mean.pow(2).mean() + eps)
assert torch.allclose(stored, normed, rtol=1e-2, atol=1e-2), "compress_norm_rope_store"
assert cache.view(4 * page_size, 2 * hd)[torch.arange(8) != 3].eq(0).all(), "wrote outside out_loc"
print(f"dsv4_ops {dsv4_ops.__version__} (torch {torch.__version__}) from {dsv4_ops.__file__}: "
      f"{len(_library.OP_NAMES)} ops registered, compress_forward and the bf16 store agree")
