"""End-to-end simulated serving with dsv4_ops: a few requests go through prefill, extend and
decode steps; every step runs the planners, compress_forward and compress_norm_rope_store
for the compressors of DeepSeek-V4 and is checked against the reference (compressed tokens,
every cache byte, every state row). Exits non-zero on any mismatch.

    python examples/serving_demo.py [--device cpu|cuda] [--decode-steps N] [--seed S]
"""
import argparse
import os
import sys
import time

import torch

try:
    import dsv4_ops  # noqa: F401
except ImportError:  # run from a source checkout without installing: use the in-place build
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dsv4_ops.testing.simulate import ServingSimulator, deepseek_v4_compressors  # noqa: E402

SHORT = {"c4_indexer_fp8": "idx-fp8", "c4_indexer_fp4": "idx-fp4", "c4_main": "c4",
         "c128_main": "c128"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

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
    elapsed = time.perf_counter() - t0

    print("-" * len(head))
    lens = ", ".join(f"{r.name}={r.seq_len}" for r in final)
    print(f"{sim.steps + spec.steps} steps in {elapsed:.1f} s; final lengths {lens}")
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        for f in failures[:30]:
            print("  " + f)
        return 1
    print("OK: every compressed token, cache byte and state row matches the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
