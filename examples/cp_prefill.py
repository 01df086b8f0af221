"""Context-parallel prefill with dsv4_ops.distributed (docs/contract.md 8): the ranks split a
prefill batch's tokens (blocks of 128 dealt round-robin) and compress it two ways,
* partials: cp_compress, each rank pools the rows it holds into per-window partials, merged by
  all_reduce MAX / SUM;
* all-gather: every rank all-gathers the raw kv_score rows, then runs compress_forward on the
  whole batch;
for the three compressors of DeepSeek-V4 (c4 main, c4 indexer, c128 main). Prints the bytes
each rank sends per prefill token (ring collectives) and the wall time of both paths, and checks
that both give the same rows (within 1e-6), the same state bytes, and the oracle's rows
(within the contract's 1e-4). Exits non-zero on a mismatch.

    torchrun --nproc-per-node 2 examples/cp_prefill.py [--requests 2] [--tokens 2048]
                                                       [--device cpu|cuda] [--reps 5]

gloo on the CPU, NCCL on GPUs (one per rank: cuda:LOCAL_RANK).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

try:
    import dsv4_ops  # noqa: F401
except ImportError:  # run from a source checkout without installing: use the in-place build
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dsv4_ops  # noqa: E402
from dsv4_ops import Compressor  # noqa: E402
from dsv4_ops.distributed import ContextParallelPlan, cp_compress  # noqa: E402
from dsv4_ops.testing import reference, worlds  # noqa: E402

COMPRESSORS = [("c4 main", 4, 512), ("c4 indexer", 4, 128), ("c128 main", 128, 512)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall_ms(fn, device, reps: int) -> float:
    """Median wall time of fn over reps calls, every rank starting together."""
    fn()  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def all_gather_rows(rows: torch.Tensor, mine: torch.Tensor, num_q: int) -> torch.Tensor:
    """The batch's [num_q, row] kv_score rows on every rank, from each rank's rows (padded to
    the longest share, with their ragged ids)."""
    world = dist.get_world_size()
    n = torch.tensor([rows.shape[0]], device=rows.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n)
    longest = int(max(int(s) for s in sizes))
    padded = rows.new_zeros((longest, rows.shape[1]))
    padded[: rows.shape[0]] = rows
    ids = torch.full((longest,), num_q, dtype=torch.int64, device=rows.device)  # num_q: padding
    ids[: rows.shape[0]] = mine
    all_rows = rows.new_empty((world * longest, rows.shape[1]))
    all_ids = ids.new_empty((world * longest,))
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # (older torch)
    gather(all_rows, padded)
    gather(all_ids, ids)
    full = rows.new_empty((num_q + 1, rows.shape[1]))
    full[all_ids] = all_rows
    return full[:num_q]


def run(label: str, cr: int, hd: int, args, device: torch.device) -> bool:
    rank, world = dist.get_rank(), dist.get_world_size()
    reqs = [(args.tokens, args.tokens)] * args.requests
    w = worlds.make_world(device, Compressor(cr, hd), reqs, seed=cr + hd)
    plan = dsv4_ops.CompressorPrefillPlan.generate(
        cr, w.rid, w.seq_lens_cpu, w.extend_lens_cpu, w.req_to_token, w.full_to_state,
        w.swa_page_size, w.ring, w.num_q, use_req_ring=w.use_req_ring)
    q = torch.arange(w.num_q, device=device)
    mine = q[(q // 128) % world == rank]
    cp = ContextParallelPlan.generate(plan, mine, w.num_q)
    x = w.kv_in[mine].contiguous()
    start = w.state.clone()
    states = {"partials": start.clone(), "all-gather": start.clone()}
    outs = {}

    def partials():
        outs["partials"] = cp_compress(states["partials"], x, w.ape, cp, head_dim=hd,
                                       compress_ratio=cr)

    def gathered():
        full = all_gather_rows(x, mine, w.num_q)
        outs["all-gather"] = dsv4_ops.compress_forward(states["all-gather"], full, w.ape, plan,
                                                       head_dim=hd, compress_ratio=cr)

    t_partials = wall_ms(partials, device, args.reps)
    t_gather = wall_ms(gathered, device, args.reps)

    # Bytes one rank sends per prefill token of the batch: a ring all-reduce of n bytes sends
    # 2 (R-1)/R n, a ring all-gather of n bytes per rank sends n.
    row_bytes = w.kv_in.shape[1] * w.kv_in.element_size()
    b_partials = 2 * (world - 1) / world * cp.exchanged_bytes(hd, w.kv_in.element_size())
    b_gather = (world - 1) * x.shape[0] * row_bytes
    per_tok = [float(v) / w.num_q for v in (b_partials, b_gather)]

    ok = True
    try:
        torch.testing.assert_close(outs["partials"], outs["all-gather"], rtol=1e-6, atol=1e-6)
        want = torch.cat([reference.compressed_tokens(w.kv_in[i * args.tokens:(i + 1) * args.tokens]
                                                      .cpu(), w.ape.cpu(), cr, hd)
                          for i in range(args.requests)])
        torch.testing.assert_close(outs["partials"].cpu().double(), want, rtol=1e-4, atol=1e-4)
    except AssertionError as e:
        print(f"[rank {rank}] {label}: rows differ: {str(e).splitlines()[:3]}", flush=True)
        ok = False
    if not torch.equal(states["partials"], states["all-gather"]):
        print(f"[rank {rank}] {label}: state rows differ", flush=True)
        ok = False
    if rank == 0:
        print(f"{label:<11} hd {hd:>3} cr {cr:>3} {w.num_q:>7} {cp.plan_c.shape[0]:>8} "
              f"{per_tok[0]:>10.1f} {per_tok[1]:>11.1f} {per_tok[1] / per_tok[0]:>6.1f}x "
              f"{t_partials:>12.2f} {t_gather:>13.2f}", flush=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=2048, help="prompt tokens per request")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get(
            "LOCAL_WORLD_SIZE", "1"))))
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"context-parallel prefill on {world} ranks ({dist.get_backend()}, {device.type}): "
              f"{args.requests} x {args.tokens} tokens, blocks of 128 dealt round-robin; bytes "
              f"a rank sends per prefill token, median wall ms of {args.reps} runs", flush=True)
        print(f"{'compressor':<11} {'':>6} {'':>6} {'tokens':>7} {'windows':>8} "
              f"{'partials B':>10} {'all-gather B':>11} {'ratio':>7} {'partials ms':>12} "
              f"{'all-gather ms':>13}", flush=True)
    with torch.inference_mode():
        ok = all([run(label, cr, hd, args, device) for label, cr, hd in COMPRESSORS])
    flags = torch.tensor([int(ok)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    good = bool(flags.item())
    if dist.get_rank() == 0:
        print("OK: both paths give the same rows and state bytes, equal to the reference" if good
              else "MISMATCH: see the messages above", flush=True)
    dist.destroy_process_group()
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
