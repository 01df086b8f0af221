"""End-to-end simulated serving with dsv4_ops: a few requests go through prefill, extend and
decode steps; every step runs the planners and compress_and_store (compress_forward and
compress_norm_rope_store in one op) for the compressors of DeepSeek-V4 and is checked against
the reference (compressed tokens, every cache byte, every state row). Exits non-zero on any
mismatch.

With `--model v4.1`: one ratio-1 and one ratio-2 layer of DeepSeek-V4.1 through chunked
prefill, decode and speculative verify steps (the c1 / c2 ops, kv_store into the V41 main
cache, the V41_FP4 compressed caches, the index-K store), checked at the end against the
whole-sequence reference (dsv4_ops.testing.reference_v41).

    python examples/serving_demo.py [--model v4|v4.1] [--device cpu|cuda] [--decode-steps N]
                                    [--seed S]
"""
import argparse
import os
import random
import sys
import time

import torch

try:
    import dsv4_ops  # noqa: F401
except ImportError:  # run from a source checkout without installing: use the in-place build
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dsv4_ops  # noqa: E402
from dsv4_ops import KVLayout  # noqa: E402
from dsv4_ops.testing import reference_v41 as ref41  # noqa: E402
from dsv4_ops.testing.simulate import ServingSimulator, deepseek_v4_compressors  # noqa: E402
from dsv4_ops.testing.worlds import rope_table  # noqa: E402

SHORT = {"c4_indexer_fp8": "idx-fp8", "c4_indexer_fp4": "idx-fp4", "c4_main": "c4",
         "c128_main": "c128"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("v4", "v4.1"), default="v4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    return run_v41(args) if args.model == "v4.1" else run_v4(args)


def _verdict(failures: list, what: str) -> int:
    """Exit status 0 when nothing mismatched (printing what was checked), else 1 and the first
    30 mismatches."""
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        for f in failures[:30]:
            print("  " + f)
        return 1
    print(f"OK: {what} matches the reference")
    return 0


def run_v4(args) -> int:
    # cr=4 indexer (hd 128, fp8 and fp4 stores), cr=4 main and cr=128 main (hd 512, fp8_ds_mla)
    compressors = deepseek_v4_compressors(indexer_stores=("fp8_indexer", "fp4_indexer"))
    sim = ServingSimulator(compressors, device=args.device, max_requests=4, max_context=1024,
                           seed=args.seed, raise_on_mismatch=False)
    names = [c.name for c in compressors]
    print(f"dsv4_ops serving demo on {args.device}: compressors "
          + ", ".join(f"{c.name} (cr {c.compress_ratio}, hd {c.head_dim}, {c.store_format}, "
                      f"{c.addressing})" for c in compressors))
    head = (f"{'step':>4} {'kind':<7} {'reqs':>4} {'tokens':>6} | "
            + " ".join(f"{SHORT[n]:>7}" for n in names)
            + f" | {'max err':>8} {'cache B':>8} {'state rows':>10}"
            + f" | {'ops ms':>7} {'check ms':>8}")
    print("compressed tokens per compressor, max |error| vs reference, cache bytes and state "
          "rows checked:")
    print(head)
    print("-" * len(head))

    failures = []

    def run(sim, batch, kind=None):
        res = sim.step(batch, kind)
        reps = [res.reports[n] for n in names]
        print(f"{res.index:>4} {kind or res.kind:<7} {res.num_requests:>4} "
              f"{res.num_tokens:>6} | " + " ".join(f"{r.compressed:>7}" for r in reps)
              + f" | {max(r.max_abs_err for r in reps):>8.1e} "
              f"{sum(r.cache_bytes_checked for r in reps):>8} "
              f"{sum(r.state_rows_checked for r in reps):>10} | "
              f"{1e3 * res.op_seconds:>7.1f} {1e3 * res.check_seconds:>8.1f}"
              + ("   MISMATCH" if res.failures else ""))
        failures.extend(f"step {res.index}: {f}" for f in res.failures)
        return res

    t0 = time.perf_counter()
    a, b = sim.add_request("a"), sim.add_request("b")
    run(sim, [(a, 250), (b, 77)])                  # prefill two requests (ragged)
    for _ in range(args.decode_steps):             # decode; a closes a cr=128 window at 256
        run(sim, [(a, 1), (b, 1)])
    c = sim.add_request("c")
    run(sim, [(c, 130), (a, 0), (b, 5)])           # c joins; a idles in the batch; b extends
    for _ in range(args.decode_steps):
        run(sim, [(a, 1), (b, 1), (c, 1)])
    run(sim, [(b, 200), (c, 3)])                   # long extend across a cr=128 window
    sim.finish(a)
    d = sim.add_request("d")
    run(sim, [(d, 257), (c, 1)], "extend")         # a's pages go back to the pool, d reuses them
    for _ in range(args.decode_steps):
        run(sim, [(b, 1), (c, 1), (d, 1)])
    final = [b, c, d]

    # Speculative decoding: rings of 16 / 256 leave room for draft tokens; a verify step is an
    # extend of width w, after which the engine keeps the accepted tokens (truncate).
    print(f"speculative decoding (rings 16 / 256), verify width 4, CUDA-graph padded plans:")
    spec = ServingSimulator(compressors, device=args.device, max_requests=2, max_context=512,
                            seed=args.seed + 1, speculative=True, use_cuda_graph=True,
                            raise_on_mismatch=False)
    e, f = spec.add_request("e"), spec.add_request("f")
    run(spec, [(e, 126), (f, 31)])
    for accept_e, accept_f in [(4, 1), (2, 3), (1, 4), (3, 2)]:
        pe, pf = e.seq_len, f.seq_len
        run(spec, [(e, 4), (f, 4)], "verify")
        spec.truncate(e, pe + accept_e)
        spec.truncate(f, pf + accept_f)
        run(spec, [(e, 1), (f, 1)])
    final += [e, f]

    # The online cr=128 running state rolls back through the draft ops (docs/contract.md 10):
    # banks staged per verify token, the accepted prefix committed at the next step.
    print("speculative decoding with the online cr=128 state (stage, mark, commit), verify "
          "widths 1..8, random acceptance:")
    online = ServingSimulator(
        deepseek_v4_compressors(indexer_stores=("fp8_indexer", "fp4_indexer"),
                                c128_addressing="online"),
        device=args.device, max_requests=2, max_context=512, seed=args.seed + 2,
        speculative=True, raise_on_mismatch=False)
    g, h = online.add_request("g"), online.add_request("h")
    run(online, [(g, 120), (h, 9)])
    rng = random.Random(args.seed)
    for _ in range(args.decode_steps):
        d = rng.randint(1, 8)
        pg, ph = g.seq_len, h.seq_len
        run(online, [(g, d), (h, d)], "verify")
        online.truncate(g, pg + rng.randint(1, d))
        online.truncate(h, ph + rng.randint(1, d))
    run(online, [(g, 1), (h, 1)])
    final += [g, h]
    elapsed = time.perf_counter() - t0

    print("-" * len(head))
    lens = ", ".join(f"{r.name}={r.seq_len}" for r in final)
    print(f"{sim.steps + spec.steps + online.steps} steps in {elapsed:.1f} s; final lengths {lens}")
    return _verdict(failures, "every compressed token, cache byte and state row")


# ------------------------------------------------------------------------------------------
# DeepSeek-V4.1: one ratio-1 and one ratio-2 layer (contract V4.1)
# ------------------------------------------------------------------------------------------
V41_PAGE = 16            # FULL-pool page size; the ratio-r caches have pages of V41_PAGE // r
V41_MAX_CONTEXT = 128
V41_EPS = 1e-6
V41_MAIN, V41_EXTRA = KVLayout.V41, KVLayout.V41_FP4   # main (SWA) and compressed caches


class _Request41:
    """One request: its row of the request pool, its FULL-pool pages and, per layer, the rows
    of its committed tokens and what the kernels returned for them (latents, index keys)."""

    def __init__(self, name: str, rid: int, pages, layers):
        self.name, self.rid, self.pages, self.length = name, rid, pages, 0
        self.rows = {r: [] for r in layers}       # per token: (compressor row, main-cache row)
        self.latent = {r: {} for r in layers}     # pos -> the kernel's latent
        self.index_k = {r: {} for r in layers}    # pos -> the index-key input k

    def raw_loc(self, pos: int) -> int:
        return self.pages[pos // V41_PAGE] * V41_PAGE + pos % V41_PAGE


class _Layer41:
    """The buffers of one ratio-r layer: the main cache (kv_store), the compressed cache, the
    index-K cache and, for ratio 2, the pair-state ring; the weights."""

    def __init__(self, ratio: int, num_pages: int, num_requests: int, ring: int, dev, g):
        self.ratio, self.ring = ratio, ring
        self.page = V41_PAGE // ratio
        self.main = dsv4_ops.kv_cache(V41_MAIN, num_pages, V41_PAGE, device=dev)
        self.extra = dsv4_ops.kv_cache(V41_EXTRA, num_pages, self.page, device=dev)
        self.index = torch.zeros(num_pages, 68 * self.page, dtype=torch.uint8, device=dev)
        self.state = None
        if ratio == 2:
            self.state = dsv4_ops.state_buffer(2, 512, dsv4_ops.state_slots(
                "pair_ring", compress_ratio=2, ring_size=ring, num_requests=num_requests),
                device=dev)
            self.state[:, 512:] = float("-inf")   # cleared rows: kv 0, score -inf
        self.norm_w = (1 + 0.1 * torch.randn(512, generator=g)).bfloat16().to(dev)
        self.k_norm_w = (1 + 0.1 * torch.randn(128, generator=g)).bfloat16().to(dev)
        self.wk = (torch.randn(512, 128, generator=g) / 512 ** 0.5).bfloat16().to(dev)

    def new_row(self, g) -> torch.Tensor:
        """A token's compressor input: kv bf16 [512] (ratio 1), kv | score fp32 [1024]."""
        if self.ratio == 1:
            return torch.randn(512, generator=g).bfloat16()
        return torch.cat([torch.randn(512, generator=g), 2 * torch.randn(512, generator=g)])

    def pad_row(self) -> torch.Tensor:
        return torch.zeros_like(self.new_row(torch.Generator()))


def _v41_step(layers, freqs, batch, kind: str, draft_len: int, dev, g) -> dict:
    """One forward step: batch = [(request, new tokens)], padded rows (raw_out_loc 0, pos 0,
    rid 0) appended; every layer runs its compressor, main-cache and index-K stores."""
    rows = []                    # (request or None, pos)
    starts, lens = [], []
    for req, n in batch:
        starts.append(len(rows))
        lens.append(n)
        rows += [(req, req.length + j) for j in range(n)]
    pad = {"decode": 1, "verify": draft_len, "extend": 3}[kind]
    rows += [(None, 0)] * pad
    pos = torch.tensor([p for _, p in rows], device=dev)
    rid = torch.tensor([r.rid if r else 0 for r, _ in rows], device=dev)
    raw = torch.tensor([r.raw_loc(p) if r else 0 for r, p in rows], device=dev)
    for layer in layers.values():
        for req, p in rows:
            if req is not None and p >= len(req.rows[layer.ratio]):
                req.rows[layer.ratio].append((layer.new_row(g), torch.randn(512, generator=g)
                                              .bfloat16()))
        x = torch.stack([req.rows[layer.ratio][p][0] if req else layer.pad_row()
                         for req, p in rows]).to(dev)
        swa = torch.stack([req.rows[layer.ratio][p][1] if req else torch.zeros(512).bfloat16()
                           for req, p in rows]).to(dev)
        # the main (sliding-window) cache: normed rows, RoPE in the store
        dsv4_ops.fused_store_cache(swa, layer.main, torch.where(raw > 0, raw, -1),
                                   page_size=V41_PAGE, layout=V41_MAIN, freqs_cis=freqs[pos])
        common = dict(page_size=layer.page, layout=V41_EXTRA)
        if layer.ratio == 1:
            latent = dsv4_ops.c1_decode_norm_rope_store(x, layer.norm_w, pos, raw, V41_EPS, freqs,
                                                        layer.extra, **common)
        elif kind == "extend":
            latent = dsv4_ops.c2_prefill_norm_rope_store(
                x, layer.state, layer.norm_w, pos, rid, raw, V41_EPS, freqs, layer.extra,
                torch.tensor(starts, dtype=torch.int32, device=dev),
                torch.tensor(lens, dtype=torch.int32, device=dev), ring_size=layer.ring, **common)
        else:
            latent = dsv4_ops.c2_decode_norm_rope_store(
                x, layer.state, layer.norm_w, pos, rid, raw, V41_EPS, freqs, layer.extra,
                ring_size=layer.ring, draft_len=draft_len, **common)
        k = latent @ layer.wk                     # the index-key projection (bf16 GEMM)
        loc = dsv4_ops.low_ratio_out_loc(layer.ratio, pos, raw)
        dsv4_ops.index_k_norm_rope_pack_store(k, layer.k_norm_w, V41_EPS, freqs, pos, loc,
                                              layer.index, ratio=layer.ratio)
        latent, k, loc = latent.cpu(), k.cpu(), loc.cpu()
        for t, (req, p) in enumerate(rows):
            if req is not None and (p + 1) % layer.ratio == 0:
                req.latent[layer.ratio][p], req.index_k[layer.ratio][p] = latent[t], k[t]
    for req, n in batch:
        req.length += n
    return {"rows": len(rows), "padded": pad}


def _v41_check(layers, requests, freqs) -> list:
    """The whole sequences against reference_v41: latents per the conformance rule (contract
    V4.1 6), then every byte of every cache exact given the kernel's latents and index keys, and
    the ring rows a next step reads bitwise."""
    failures = []
    freqs = freqs.cpu()
    for layer in layers.values():
        r = layer.ratio
        main, extra = torch.zeros_like(layer.main.cpu()), torch.zeros_like(layer.extra.cpu())
        index = torch.zeros_like(layer.index.cpu())
        for req in requests:
            seq = req.rows[r][:req.length]
            x = torch.stack([row for row, _ in seq])
            swa = torch.stack([row for _, row in seq])
            raw = torch.tensor([req.raw_loc(p) for p in range(req.length)])
            all_pos = torch.arange(req.length)
            ref41.store_rows(main, ref41.rope_latent(swa, all_pos, freqs), raw, V41_MAIN, V41_PAGE)
            want, pos = ref41.latents(x, r, layer.norm_w.cpu(), V41_EPS)
            got = torch.stack([req.latent[r][int(p)] for p in pos])
            d = _bf16_ulps(got, want)
            if int((d > 1).sum()) or int((d == 1).sum()) > max(1, d.numel() // 1000):
                failures.append(f"ratio {r} {req.name}: latent beyond 1 ulp or too many 1-ulp "
                                f"elements ({int((d > 0).sum())} of {d.numel()})")
            rotated = ref41.rope_latent(got, ref41.group_positions(r, pos), freqs)
            ref41.store_rows(extra, ref41.stored_value(rotated, V41_EXTRA), raw[pos] // r,
                             V41_EXTRA, layer.page)
            k = torch.stack([req.index_k[r][int(p)] for p in pos])
            ref41.index_k_store(index, k, layer.k_norm_w.cpu(), V41_EPS, freqs, pos,
                                ref41.low_ratio_out_loc(r, pos, raw[pos]), r, layer.page)
            if layer.state is not None:
                first = max(0, req.length - layer.ring)
                for p in range(first + (first & 1), req.length, 2):    # the even rows read next
                    slot = req.rid * layer.ring + p % layer.ring
                    if not torch.equal(layer.state[slot].cpu().view(torch.int32),
                                       x[p].view(torch.int32)):
                        failures.append(f"ratio 2 {req.name}: ring row of pos {p} not its row")
        for what, got, want in (("main cache", layer.main, main), ("compressed cache",
                                layer.extra, extra), ("index-K cache", layer.index, index)):
            bad = int((got.cpu() != want).sum())
            if bad:
                failures.append(f"ratio {r} {what}: {bad} bytes differ from the reference")
    return failures


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    def order(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits & 0x7FFF)
    return (order(a) - order(b)).abs()


def run_v41(args) -> int:
    dev = args.device
    g = torch.Generator().manual_seed(args.seed)
    draft_len = 4                                             # verify blocks of 4 tokens
    ring = dsv4_ops.pair_ring_size(num_draft_tokens=draft_len - 1)      # 8 > draft_len
    num_requests = 3
    num_pages = 1 + num_requests * V41_MAX_CONTEXT // V41_PAGE        # page 0 is reserved
    free = (torch.randperm(num_pages - 1, generator=g) + 1).tolist()
    layers = {r: _Layer41(r, num_pages, num_requests, ring, dev, g) for r in (1, 2)}
    freqs = rope_table(V41_MAX_CONTEXT, device=dev)
    reqs = []

    def add(name):
        pages = [free.pop() for _ in range(V41_MAX_CONTEXT // V41_PAGE)]
        reqs.append(_Request41(name, len(reqs), pages, layers))
        return reqs[-1]

    print(f"dsv4_ops serving demo, DeepSeek-V4.1, on {dev}: ratio-1 and ratio-2 layers; main "
          f"cache {V41_MAIN.value}, compressed caches {V41_EXTRA.value}, index-K; pair-state "
          f"ring {ring}, verify blocks of {draft_len}")
    head = f"{'step':>4} {'kind':<7} {'rows':>4} {'padded':>6} | {'lengths':<24} | {'step ms':>7}"
    print(head)
    print("-" * len(head))
    step = [0]

    def run(batch, kind, accept=()):
        t0 = time.perf_counter()
        res = _v41_step(layers, freqs, batch, kind, draft_len if kind == "verify" else 1, dev, g)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        for (req, n), keep in zip(batch, accept):   # verify: the rejected drafts go
            req.length -= n - keep
            for r in layers:
                del req.rows[r][req.length:]
        step[0] += 1
        lens = " ".join(f"{r.name}={r.length}" for r in reqs)
        print(f"{step[0]:>4} {kind:<7} {res['rows']:>4} {res['padded']:>6} | {lens:<24} | "
              f"{1e3 * (time.perf_counter() - t0):>7.1f}")

    t0 = time.perf_counter()
    a, b = add("a"), add("b")
    run([(a, 37), (b, 20)], "extend")               # chunked prefill: a's chunk ends even
    c = add("c")
    run([(a, 12), (b, 0), (c, 9)], "extend")        # a's next chunk starts odd: ring partner
    for _ in range(args.decode_steps):
        run([(a, 1), (b, 1), (c, 1)], "decode")
    for accept in [(4, 1), (2, 3), (1, 4)]:         # accepted tokens of a and b
        run([(a, draft_len), (b, draft_len)], "verify", accept)
    for _ in range(max(args.decode_steps, draft_len)):  # past every rejected draft position
        run([(a, 1), (b, 1), (c, 1)], "decode")
    failures = _v41_check(layers, reqs, freqs)
    print("-" * len(head))
    print(f"{step[0]} steps in {time.perf_counter() - t0:.1f} s; final lengths "
          + ", ".join(f"{r.name}={r.length}" for r in reqs))
    return _verdict(failures, "every latent, cache byte, index-K byte and ring row")


if __name__ == "__main__":
    sys.exit(main())
