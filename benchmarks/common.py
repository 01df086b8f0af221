"""Shared benchmark machinery: device timers, the copy-bandwidth ceiling, the cases' worlds
(page tables, state buffers, inputs, caches: dsv4_ops.testing.worlds), minimum-traffic byte
models, row/table helpers.

Conventions
-----------
* Times are microseconds. ``cold`` = median of per-call CUDA-event times with a 256 MiB
  write before every call (evicts the H200's L2), ``graph`` = median per-call time of
  back-to-back calls replayed from one CUDA graph (no launch overhead, warm L2), ``wall`` =
  host wall clock including a device synchronize. On CPU every timing is a wall-clock median.
* Bytes are the algorithmic minimum of DRAM traffic of an op (every input row read once,
  the state rows the op needs, every state row / output row / cache slot written). The
  formulas are the ones the peer harness (the reference engine's benchmark) uses, so GB/s
  figures of both implementations compare; where the peer has no model (bf16 / fp4 stores,
  online state) the same rules are extended and documented next to the function.
* A "row" is a dict: case, op, time_us, graph_us, bytes, gbps, frac_copy, frac_same_copy,
  ref_us, speedup_ref (reference time / dsv4 time, None when the reference is not timed),
  timing (which measurement time_us is), error.
* frac_copy compares against the ceiling (a 1 GiB copy); frac_same_copy against a copy
  moving the row's own bytes, timed the same way (cold rows of at least 1 MB). A short op
  pays the same fixed costs as a short copy (launch, the write-back of the L2 lines the
  flush dirtied): on the H200 a copy of the cr 128 prefill's 135 MB reaches only ~80 % of
  the ceiling, so frac_same_copy is the fair "how close to the copy floor" figure.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

if TYPE_CHECKING:  # dsv4_ops is imported where it is used: the runner reports a failing import
    from dsv4_ops.testing.worlds import World

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------
# Model / engine constants (docs/contract.md 2, 4; the reference engine's defaults for DeepSeek-V4)
# --------------------------------------------------------------------------------------
FULL_PAGE = 256          # tokens per page of the full KV pool (req_to_token granularity)
SWA_PAGE = 256           # swa_page_size
SWA_TAIL = 8             # tokens before an extend that the SWA pool still holds
NORM_EPS = 1e-6
ROPE_THETA = 10000.0
FLUSH_BYTES = 256 << 20

# (label, head_dim, ratio) as in the model: C4 main + C4 indexer, C128 main.
COMBOS = [("main", 512, 4), ("main", 512, 128), ("indexer", 128, 4)]
DECODE_BS = [1, 8, 64, 256, 1024]
DECODE_CTX = (1024, 8192)
PREFILL_CASES = [
    ("p8x4096", [(4096, 4096)] * 8),
    ("p1x32768", [(32768, 32768)]),
    ("p4x2000+2048", [(4048, 2048)] * 4),  # unaligned 2000-token prefix: state reads
]
# --smoke: tiny shapes to exercise the scripts' logic on a CPU in seconds
SMOKE_DECODE_BS = [1, 8]
SMOKE_PREFILL_CASES = [("p2x300", [(300, 300)] * 2), ("p2x200+100", [(300, 100)] * 2)]



def log(*a: Any) -> None:
    print(*a, flush=True)


def store_token_bytes(store_format: str) -> int:
    """Bytes a store writes per token: its data and its scale slot (contract 4)."""
    import dsv4_ops

    fmt = dsv4_ops.STORE_FORMATS[store_format]
    return fmt.data_bytes + fmt.scale_stride


def store_flags(store_format: str) -> Dict[str, bool]:
    """compress_norm_rope_store keyword flags that select `store_format`."""
    return {"use_fp4": store_format == "fp4_indexer", "bf16_store": store_format == "bf16"}


def esize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(
        dtype, str(dtype).replace("torch.", ""))


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------
def stats(ts: Sequence[float]) -> Dict[str, float]:
    ts = sorted(ts)
    n = len(ts)
    return {"median": statistics.median(ts), "p10": ts[int(0.1 * (n - 1))],
            "p90": ts[int(0.9 * (n - 1))], "min": ts[0], "n": n}


class Timer:
    """cold / graph / wall timings on one device (see the module docstring)."""

    def __init__(self, device, flush_bytes: int = FLUSH_BYTES):
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.flush = (torch.empty(flush_bytes, dtype=torch.uint8, device=self.device)
                      if self.is_cuda else None)

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def wall(self, fn: Callable[[], Any], reps: int, warmup: int) -> Dict[str, float]:
        for _ in range(warmup):
            fn()
        self.sync()
        ts = []
        for _ in range(max(1, reps)):
            t0 = time.perf_counter()
            fn()
            self.sync()
            ts.append((time.perf_counter() - t0) * 1e6)
        return stats(ts)

    def cold(self, fn: Callable[[], Any], reps: int, warmup: int) -> Dict[str, float]:
        return self.cold_each({"fn": fn}, reps, warmup)["fn"]

    def cold_each(self, fns: Dict[str, Callable[[], Any]], reps: int, warmup: int
                  ) -> Dict[str, Dict[str, float]]:
        """cold() of every call, interleaved: repetition i times each call once, in an order
        rotated by i, so clock drift and the order of the calls fall on all of them alike."""
        names = list(fns)
        for name in names:
            for _ in range(warmup):
                fns[name]()
        self.sync()
        samples: Dict[str, list] = {n: [] for n in names}
        for i in range(max(1, reps)):
            for name in _rotated(names, i):
                if not self.is_cuda:
                    t0 = time.perf_counter()
                    fns[name]()
                    samples[name].append((time.perf_counter() - t0) * 1e6)
                    continue
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                self.flush.zero_()
                start.record()
                fns[name]()
                end.record()
                samples[name].append((start, end))
        self.sync()
        if self.is_cuda:
            samples = {n: [s.elapsed_time(e) * 1e3 for s, e in ev] for n, ev in samples.items()}
        return {n: stats(t) for n, t in samples.items()}

    def graph(self, fn: Callable[[], Any], per_graph: int, replays: int
              ) -> Optional[Dict[str, float]]:
        """Per-call time of `per_graph` back-to-back calls captured in one CUDA graph."""
        if not self.is_cuda:
            return None
        return self.graph_each({"fn": self.capture(fn, per_graph)}, per_graph, replays)["fn"]

    def capture(self, fn: Callable[[], Any], per_graph: int) -> "torch.cuda.CUDAGraph":
        """A CUDA graph of `per_graph` back-to-back calls of fn, replayed twice."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per_graph):
                fn()
        for _ in range(2):
            g.replay()
        torch.cuda.synchronize(self.device)
        return g

    def graph_each(self, graphs: Dict[str, "torch.cuda.CUDAGraph"], per_graph: int,
                   replays: int) -> Dict[str, Dict[str, float]]:
        """Per-call times of graphs capture() made of `per_graph` calls each, the replays
        interleaved in rotated order as in cold_each."""
        names = list(graphs)
        events = {n: [] for n in names}
        for i in range(max(1, replays)):
            for name in _rotated(names, i):
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                graphs[name].replay()
                end.record()
                events[name].append((start, end))
        torch.cuda.synchronize(self.device)
        return {n: stats([s.elapsed_time(e) * 1e3 / per_graph for s, e in ev])
                for n, ev in events.items()}


def _rotated(names: List[str], i: int) -> List[str]:
    k = i % len(names)
    return names[k:] + names[:k]


def copy_bandwidth(timer: Timer, nbytes: Optional[int] = None, reps: int = 10) -> Dict[str, Any]:
    """Device-to-device copy of `nbytes`: (bytes read + bytes written) / median time."""
    if nbytes is None:
        nbytes = (1 << 30) if timer.is_cuda else (1 << 27)
    a = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    a.fill_(1)
    b = torch.empty_like(a)
    st = timer.cold(lambda: b.copy_(a), reps, 2)
    del a, b
    if timer.is_cuda:
        torch.cuda.empty_cache()
    return {"gbps": 2 * nbytes / (st["median"] * 1e3), "bytes": 2 * nbytes, "time_us": st}


def device_healthy(device: torch.device) -> Optional[str]:
    """None if the device still runs work, else the error (a sticky CUDA error)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        x = torch.ones(4, device=device)
        x.add_(1)
        torch.cuda.synchronize(device)
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


class DeviceLost(RuntimeError):
    """The CUDA context is unusable (sticky error): stop benchmarking on this device."""


# --------------------------------------------------------------------------------------
# Context: device, timer, ceiling, settings shared by every family
# --------------------------------------------------------------------------------------
@dataclass
class Context:
    device: torch.device
    timer: Timer
    quick: bool = False
    smoke: bool = False
    only: Optional["re.Pattern[str]"] = None
    reps: int = 100
    reps_big: int = 20
    warmup: int = 5
    graph_replays: int = 10
    no_graph: bool = False
    no_ref: bool = False
    ref_reps: int = 5
    ref_max_elems: int = 1 << 27
    deadline: Optional[float] = None  # time.monotonic() after which no new case starts
    copy: Dict[str, Any] = field(default_factory=dict)
    same_size_copy: Dict[int, float] = field(default_factory=dict)  # MB -> GB/s
    skipped_for_time: List[str] = field(default_factory=list)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def copy_gbps(self) -> Optional[float]:
        return self.copy.get("gbps")

    def selected(self, name: str) -> bool:
        return self.only is None or bool(self.only.search(name))

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def measure_copy(self) -> Dict[str, Any]:
        self.copy = copy_bandwidth(self.timer)
        log(f"[ceiling] device copy {self.copy['gbps']:.0f} GB/s (read+write) on {self.device}")
        return self.copy

    def same_copy_gbps(self, nbytes: Optional[int]) -> Optional[float]:
        """Cold copy bandwidth of a copy that moves `nbytes` (read + write), cached per MB;
        None on CPU and below 1 MB."""
        if not self.is_cuda or not nbytes or nbytes < 1_000_000:
            return None
        key = int(round(nbytes / 1e6))
        if key not in self.same_size_copy:
            self.same_size_copy[key] = copy_bandwidth(self.timer, key * 500_000, self.reps)["gbps"]
        return self.same_size_copy[key]

    def decode_bs(self) -> List[int]:
        if self.smoke:
            return SMOKE_DECODE_BS
        return [8, 1024] if self.quick else DECODE_BS

    def prefill_cases(self) -> List[Tuple[str, List[Tuple[int, int]]]]:
        if self.smoke:
            return SMOKE_PREFILL_CASES
        return PREFILL_CASES[:1] if self.quick else PREFILL_CASES

    def prefill_variants(self, padded: bool = True
                         ) -> List[Tuple[str, List[Tuple[int, int]], bool]]:
        """(name, requests, padded) of every prefill case; with `padded`, the first case also
        with its plan as captured in a CUDA graph ("<name>_padded"): num_q rows, the invalid
        tail included."""
        out = []
        for i, (name, reqs) in enumerate(self.prefill_cases()):
            out.append((name, reqs, False))
            if padded and i == 0:
                out.append((f"{name}_padded", reqs, True))
        return out

    def ceiling_row(self) -> Dict[str, Any]:
        return ceiling_row_of(self.copy, str(self.device))


def ceiling_row_of(copy: Dict[str, Any], device: str) -> Optional[Dict[str, Any]]:
    """The copy-bandwidth measurement as a table row (None without a measurement)."""
    if not copy:
        return None
    t = copy.get("time_us")
    return {"case": "ceiling", "op": "device_copy", "time_us": t and t["median"], "graph_us": None,
            "bytes": copy.get("bytes"), "gbps": copy.get("gbps"), "frac_copy": 1.0, "ref_us": None,
            "speedup_ref": None, "timing": "cold" if device.startswith("cuda") else "cpu_wall",
            "error": None, "family": "ceiling"}


def add_common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--quick", action="store_true", help="fewer cases and repetitions")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes, 1-2 reps: checks the scripts themselves (CPU friendly)")
    ap.add_argument("--only", default=None,
                    help="regex searched in FAMILY/CASE, e.g. 'compress/main512_c4' or "
                         "'store/.*p8x4096'")
    ap.add_argument("--reps", type=int, default=None, help="cold-timing repetitions (small cases)")
    ap.add_argument("--reps-big", type=int, default=None,
                    help="repetitions for cases >= 4096 tokens")
    ap.add_argument("--no-graph", action="store_true", help="skip CUDA-graph replay timings")
    ap.add_argument("--no-ref", action="store_true", help="skip timing the plain-PyTorch reference")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new case after this many seconds (results so far are kept)")


def context_from_args(args: argparse.Namespace) -> Context:
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(dev)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    ctx = Context(device=device, timer=Timer(device), quick=args.quick, smoke=args.smoke,
                  only=re.compile(args.only) if args.only else None,
                  no_graph=args.no_graph, no_ref=args.no_ref)
    if device.type == "cuda":
        ctx.reps, ctx.reps_big, ctx.warmup, ctx.graph_replays = (
            (30, 8, 3, 5) if args.quick else (100, 20, 5, 10))
    else:
        ctx.reps, ctx.reps_big, ctx.warmup, ctx.graph_replays = 5, 2, 1, 1
        ctx.ref_reps = 2
        ctx.ref_max_elems = 1 << 23
    if args.smoke:
        ctx.reps, ctx.reps_big, ctx.warmup, ctx.graph_replays, ctx.ref_reps = 2, 2, 1, 2, 1
    if args.reps:
        ctx.reps = args.reps
    if args.reps_big:
        ctx.reps_big = args.reps_big
    if args.budget_s:
        ctx.deadline = time.monotonic() + args.budget_s
    return ctx


# --------------------------------------------------------------------------------------
# Measuring one op and turning it into a row
# --------------------------------------------------------------------------------------
def make_row(ctx: Context, case: str, op: str, nbytes: Optional[int], *, cold=None, graph=None,
             wall=None, ref=None, error: Optional[str] = None, **extra) -> Dict[str, Any]:
    prim, timing = (cold, "cold") if cold else ((wall, "wall") if wall else (None, None))
    if prim is not None and not ctx.is_cuda:
        timing = "cpu_wall"
    t = prim["median"] if prim else None
    gbps = nbytes / (t * 1e3) if (nbytes and t) else None
    ref_us = ref["median"] if ref else None
    row = {
        "case": case, "op": op, "time_us": t, "graph_us": graph["median"] if graph else None,
        "bytes": nbytes, "gbps": gbps,
        "frac_copy": (gbps / ctx.copy_gbps) if (gbps and ctx.copy_gbps) else None,
        "frac_same_copy": None,
        "ref_us": ref_us, "speedup_ref": (ref_us / t) if (ref_us and t) else None,
        "timing": timing, "error": error,
        "stats": {"cold": cold, "graph": graph, "wall": wall, "ref": ref},
    }
    if gbps and timing == "cold":
        same = ctx.same_copy_gbps(nbytes)
        row["frac_same_copy"] = gbps / same if same else None
    row.update(extra)
    return row


def measure(ctx: Context, case: str, op: str, fn: Callable[[], Any], nbytes: Optional[int], *,
            big: bool = False, cold: bool = True, wall: bool = False, graph: bool = True,
            ref_fn: Optional[Callable[[], Any]] = None, **extra) -> Dict[str, Any]:
    """Time `fn` (cold and/or wall, then CUDA-graph replay) and the reference, into one row.
    A failing graph capture or reference keeps the other timings (the error is noted)."""
    reps = ctx.reps_big if big else ctx.reps
    c = w = g = r = None
    errs = []
    if cold:
        c = ctx.timer.cold(fn, reps, ctx.warmup)
    if wall:
        # Host wall clocks are noisy (tens of microseconds per call): at least 30 samples.
        w = ctx.timer.wall(fn, max(30, reps), ctx.warmup)
    if graph and ctx.is_cuda and not ctx.no_graph:
        try:
            g = ctx.timer.graph(fn, 3 if big else 20, ctx.graph_replays)
        except Exception as e:  # noqa: BLE001
            errs.append(f"graph: {type(e).__name__}: {str(e)[:200]}")
            lost = device_healthy(ctx.device)
            if lost:
                raise DeviceLost(lost) from e
    if ref_fn is not None and not ctx.no_ref:
        try:
            r = ctx.timer.cold(ref_fn, ctx.ref_reps, 1)
        except Exception as e:  # noqa: BLE001
            errs.append(f"ref: {type(e).__name__}: {str(e)[:200]}")
    row = make_row(ctx, case, op, nbytes, cold=c, graph=g, wall=w, ref=r,
                   error="; ".join(errs) or None, **extra)
    log(format_row(row))
    return row


_TRACEBACKS = [0]


def run_cases(ctx: Context, cases: Iterable[Tuple[str, Callable[[], List[Dict[str, Any]]]]],
              family: str) -> List[Dict[str, Any]]:
    """Run (name, thunk) cases that pass --only and the time budget; a failing case becomes
    an error row; a lost CUDA context stops the family (DeviceLost propagates)."""
    rows: List[Dict[str, Any]] = []
    for name, thunk in cases:
        if not ctx.selected(f"{family}/{name}"):
            continue
        if ctx.out_of_time():
            ctx.skipped_for_time.append(f"{family}/{name}")
            continue
        try:
            for r in thunk():
                r["family"] = family
                rows.append(r)
        except DeviceLost:
            raise
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {str(e)[:500]}"
            log(f"{name}: FAILED {msg[:300]}")
            _TRACEBACKS[0] += 1
            if _TRACEBACKS[0] <= 3:  # the first few in full; the rest are usually the same
                traceback.print_exc()
            rows.append({"case": name, "op": family, "family": family, "time_us": None,
                         "graph_us": None, "bytes": None, "gbps": None, "frac_copy": None,
                         "ref_us": None, "speedup_ref": None, "timing": None, "error": msg})
            lost = device_healthy(ctx.device)
            if lost:
                raise DeviceLost(f"after {name}: {lost}") from e
        finally:
            if ctx.is_cuda:
                torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------
# Worlds: page tables, SWA mapping, state, inputs and caches of one case
# --------------------------------------------------------------------------------------
def decode_lengths(bs: int, pattern: str, ratio: int, seed: int) -> List[int]:
    """Decode seq_lens (including the new token): "rand" = uniform in DECODE_CTX,
    "bnd" = every request closes a window this step (seq_len % ratio == 0), "open" = none does."""
    rng = random.Random(seed)
    ctx = [rng.randint(*DECODE_CTX) for _ in range(bs)]
    if pattern == "rand":
        return ctx
    if pattern == "bnd":
        return [max(ratio, c // ratio * ratio) for c in ctx]
    if pattern == "open":  # no request closes a window this step
        return [max(ratio, c // ratio * ratio) + 1 for c in ctx]
    raise ValueError(f"unknown decode pattern {pattern!r}")


def case_seed(name: str) -> int:
    return zlib.crc32(name.encode()) % (1 << 30)


def make_world(*, ratio: int, head_dim: int, reqs: Sequence[Tuple[int, int]], device,
               state_dtype: torch.dtype = torch.float32, input_dtype: torch.dtype = torch.float32,
               seed: int = 0, online: bool = False, use_req_ring: bool = False,
               spare_req_slots: int = 8, state_slot_offset: int = 0,
               fill: bool = True) -> World:
    """Everything one case's ops touch, on `device` (dsv4_ops.testing.worlds): a full pool of
    256-token pages scattered over the requests, `spare_req_slots` spare request rows; the SWA
    pool holds the extend range and the 8 tokens before it (everything else is -1 in
    full_to_state); cr 4 state on SWA pages (or a request ring), cr 128 on a request ring,
    online [slots, 3*hd]; random state and inputs (`fill` False leaves them uninitialised);
    caches of one page per full page. ape, norm weight and RoPE table as the model has them."""
    import dsv4_ops
    from dsv4_ops.testing import worlds

    assert all(1 <= e <= s for s, e in reqs), reqs
    addressing = "online" if online else ("req_ring" if use_req_ring or ratio == 128
                                          else "swa_paged")
    comp = dsv4_ops.Compressor(ratio, head_dim, addressing=addressing, state_dtype=state_dtype)
    return worlds.make_world(
        device, comp, reqs, num_req_rows=len(reqs) + spare_req_slots, page_size=FULL_PAGE,
        swa_page_size=SWA_PAGE, swa_tail=SWA_TAIL, state_slot_offset=state_slot_offset,
        state_fill="randn" if fill else "empty", input_dtype=input_dtype, fill_inputs=fill,
        max_pos=max(s for s, _ in reqs) + 1, seed=seed)


# -- counts the byte models need (analytic, from contract 3.3 / 3.5; independent of the planner)
def decode_closing(w: World) -> int:
    return int((w.seq_lens_cpu % w.compress_ratio == 0).sum())


def prefill_counts(w: World) -> Dict[str, int]:
    """Compress events, write events and state rows read by a prefill (contract 3.3)."""
    r, win, ring = w.compress_ratio, w.window, w.ring
    pad = ring - win + 2 if ring > win else 0
    n_c = n_w = slots = 0
    for s, e in w.requests:
        pos = torch.arange(s - e, s, dtype=torch.int64)
        j = pos - (s - e)
        comp = (pos + 1) % r == 0
        buf = win - torch.clamp(j[comp] + 1, max=win)
        n_c += int(comp.sum())
        if r == 4:  # the overlap half of the first window (s == 4) is absent, not read
            has_ovl = (pos[comp] + 1 > 4).to(torch.int64)
            slots += int((torch.clamp(buf, max=4) * has_ovl
                          + torch.clamp(buf - 4, min=0)).sum())
        else:
            slots += int(buf.sum())
        last_c = s // r * r
        first_w = min(last_c - (4 if r == 4 else 0), s - pad)
        wr = pos >= first_w
        if w.compressor.addressing == "swa_paged":
            wr |= (pos % w.swa_page_size) >= w.swa_page_size - 4
        n_w += int(wr.sum())
    return {"n_c": n_c, "n_w": n_w, "state_slots_read": slots}


def online_decode_counts(w: World) -> Dict[str, int]:
    q = (w.seq_lens_cpu - 1) % 128
    n_close = int((q == 127).sum())
    return {"n_close": n_close, "n_state_read": int((q != 0).sum()),
            "n_state_write": w.batch_size - n_close}


def online_prefill_counts(w: World) -> Dict[str, int]:
    n_c = n_w = n_merge = 0
    for s, e in w.requests:
        a = s - e
        while a < s:
            end = min((a // 128 + 1) * 128, s)
            if a % 128:
                n_merge += 1
            if end % 128 == 0:
                n_c += 1
            else:
                n_w += 1
            a = end
    return {"n_c": n_c, "n_w": n_w, "n_merge": n_merge}


# --------------------------------------------------------------------------------------
# Byte models (minimum DRAM traffic). Same formulas as the peer harness; see module docstring.
# --------------------------------------------------------------------------------------
def bytes_decode_compress(w: World, n_bnd: int) -> int:
    """Read every input row, the 2*hd (kv, score) elements of each window row of the n_bnd
    closing requests, ape, the plan; write every input row to the state and n_bnd outputs."""
    hd, st, inp = w.head_dim, esize(w.state_dtype), esize(w.input_dtype)
    read = (w.batch_size * w.kv_score_row_width * inp + n_bnd * w.window * 2 * hd * st + w.ape.numel() * 4
            + w.batch_size * 16)
    write = w.batch_size * w.kv_score_row_width * st + n_bnd * hd * 4
    return read + write


def bytes_prefill_compress(w: World, n_c: int, buf_slots: int, n_w: int) -> int:
    """Read every input row once, the state rows the windows need (2*hd elements each), ape,
    both plans; write the persisted rows and the n_c outputs."""
    hd, st, inp = w.head_dim, esize(w.state_dtype), esize(w.input_dtype)
    read = w.num_q * w.kv_score_row_width * inp + buf_slots * 2 * hd * st + w.ape.numel() * 4 + n_c * 16 + n_w * 8
    write = n_w * w.kv_score_row_width * st + n_c * hd * 4
    return read + write


def slots_with_data(cache: torch.Tensor, page_size: int, data_bytes: int) -> int:
    """Slots of a zeroed block-split cache (each page's token data first) whose data is not all
    zero after a store."""
    view = cache.view(torch.uint8)[:, : page_size * data_bytes]
    return int((view.reshape(cache.shape[0], page_size, data_bytes) != 0).any(dim=-1).sum())


def bytes_store(w: World, n_tok: int, n_plan_rows: int, store_format: Optional[str] = None) -> int:
    """Per stored token: read its fp32 kv row, its rope freqs row and out_loc; write its
    cache bytes (data + scales); plus the plan rows and the norm weight. (The peer model has
    the fp8 formats; bf16 / fp4 only change the bytes written per token.)"""
    hd = w.head_dim
    fmt = store_format or ("fp8_indexer" if hd == 128 else "fp8_ds_mla")
    from dsv4_ops.testing.worlds import ROPE_DIM

    per_tok_read = hd * 4 + ROPE_DIM * 4 + 8
    return n_tok * (per_tok_read + store_token_bytes(fmt)) + n_plan_rows * 16 + hd * 4


def bytes_decode_plan(w: World) -> int:
    """Per request: read rid and seq_len, write 16 bytes; SWA-paged cr 4 also looks up
    req_to_token (4 B) and full_to_state (8 B) for two positions."""
    lookups = 0 if w.compressor.addressing != "swa_paged" else 2 * (4 + 8)
    return w.batch_size * (8 + 8 + lookups + 16)


def bytes_prefill_plan(w: World, n_c: int, n_w: int) -> int:
    """Per compress record 16 B (+ two slot lookups when SWA-paged), per write record 8 B
    (+ one lookup), per request 24 B of inputs."""
    lookups = 0 if w.compressor.addressing != "swa_paged" else (4 + 8)
    return n_c * (16 + 2 * lookups) + n_w * (8 + lookups) + w.batch_size * 24


# Online (cr 128 running state, contract 3.5): not in the peer harness; same rules.
def bytes_online_decode_compress(w: World, n_state_read: int, n_state_write: int,
                                  n_close: int) -> int:
    """Read every input row, the 3*hd state of each request not restarting its chunk, ape,
    the plan; write the 3*hd state of each request not closing and the closing outputs."""
    hd, st, inp = w.head_dim, esize(w.state_dtype), esize(w.input_dtype)
    read = w.batch_size * w.kv_score_row_width * inp + n_state_read * 3 * hd * st + w.ape.numel() * 4 + w.batch_size * 16
    write = n_state_write * 3 * hd * st + n_close * hd * 4
    return read + write


def bytes_online_prefill_compress(w: World, n_c: int, n_w: int, n_merge: int) -> int:
    hd, st, inp = w.head_dim, esize(w.state_dtype), esize(w.input_dtype)
    read = w.num_q * w.kv_score_row_width * inp + n_merge * 3 * hd * st + w.ape.numel() * 4 + (n_c + n_w) * 16
    write = n_w * 3 * hd * st + n_c * hd * 4
    return read + write


def bytes_online_prefill_plan(w: World, n_c: int, n_w: int) -> int:
    return (n_c + n_w) * 16 + w.batch_size * 24


# --------------------------------------------------------------------------------------
# Plain-PyTorch reference workloads (dsv4_ops.testing.reference), for the speed-up column
# --------------------------------------------------------------------------------------
def reference_module():
    try:
        from dsv4_ops.testing import reference  # noqa: WPS433
        return reference
    except Exception:  # noqa: BLE001
        return None


def ref_pool_fn(ctx: Context, w: World, n_tokens: int, per_request: bool
                ) -> Optional[Callable[[], Any]]:
    """The reference's pooling of the same number of compressed tokens as the op makes:
    per_request (prefill) = compressed_tokens over each request's extend rows; otherwise one
    call over n_tokens windows of fresh rows (decode). None when too big to time cheaply."""
    ref = reference_module()
    if ref is None or ctx.no_ref or n_tokens == 0:
        return None
    r, hd = w.compress_ratio, w.head_dim
    if per_request:
        if w.num_q * w.kv_score_row_width > ctx.ref_max_elems:
            return None
        chunks, first = [], 0
        for _, e in w.requests:
            chunks.append(w.kv_in[first: first + e])
            first += e
        return lambda: [ref.compressed_tokens(c, w.ape, r, hd) for c in chunks]
    rows = n_tokens * r
    if rows * w.kv_score_row_width > ctx.ref_max_elems:
        return None
    x = torch.randn(rows, w.kv_score_row_width, device=w.device).to(w.input_dtype)
    return lambda: ref.compressed_tokens(x, w.ape, r, hd)


def ref_store_fn(ctx: Context, w: World, kv: torch.Tensor, store_format: str
                 ) -> Optional[Callable[[], Any]]:
    """reference.store of the case's compressed tokens into a separate cache."""
    ref = reference_module()
    if ref is None or ctx.no_ref:
        return None
    pos, locs = w.closing_tokens()
    n = int(pos.numel())
    if n == 0 or n * w.head_dim * 16 > ctx.ref_max_elems:
        return None
    cache = torch.zeros_like(w.kvcache(store_format))
    x = kv[:n]
    return lambda: ref.store(cache, x, pos, locs, w.norm_weight, NORM_EPS, w.freqs_real, store_format,
                             w.cache_page_size)


# --------------------------------------------------------------------------------------
# Tables and environment
# --------------------------------------------------------------------------------------
def _f(x, nd=1, width=9):
    return f"{'-':>{width}}" if x is None else f"{x:>{width}.{nd}f}"


def _g(x, width=9):
    """3 significant digits without exponent for the usual ranges (MB, GB/s)."""
    if x is None:
        return f"{'-':>{width}}"
    if x >= 100 or x == 0:
        return f"{x:>{width}.0f}"
    return f"{x:>{width}.{max(0, 2 - int(math.floor(math.log10(abs(x)))))}f}"


TABLE_HEADER = (f"{'case':<44} {'op':<22} {'time_us':>9} {'graph_us':>9} {'MB':>9} {'GB/s':>7} "
                f"{'%copy':>6} {'x_ref':>7} {'timing':<8}")


def format_row(r: Dict[str, Any]) -> str:
    mb = r["bytes"] / 1e6 if r.get("bytes") else None
    pct = r["frac_copy"] * 100 if r.get("frac_copy") is not None else None
    s = (f"{str(r['case'])[:44]:<44} {str(r['op'])[:22]:<22} {_f(r.get('time_us'))} "
         f"{_f(r.get('graph_us'))} {_g(mb)} {_g(r.get('gbps'), 7)} {_f(pct, 1, 6)} "
         f"{_f(r.get('speedup_ref'), 1, 7)} {(r.get('timing') or '-'):<8}")
    if r.get("check") not in (None, "ok"):
        s += f" CHECK {str(r['check'])[:100]}"
    if r.get("error"):
        s += f" ERR {str(r['error'])[:140]}"
    return s


def format_table(rows: Sequence[Dict[str, Any]]) -> List[str]:
    return [TABLE_HEADER] + [format_row(r) for r in rows]


def markdown_table(rows: Sequence[Dict[str, Any]]) -> List[str]:
    def c(x, nd=1):
        return "" if x is None else f"{x:.{nd}f}"

    out = ["| case | op | time us | graph us | MB | GB/s | % copy | % same-size copy | x ref | "
           "timing | note |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        mb = r["bytes"] / 1e6 if r.get("bytes") else None
        pct = r["frac_copy"] * 100 if r.get("frac_copy") is not None else None
        same = r["frac_same_copy"] * 100 if r.get("frac_same_copy") is not None else None
        note = r.get("error") or ""
        if r.get("bytes_written"):
            note = f"writes {r['bytes_written'] / 1e6:.3g} MB {note}".strip()
        if r.get("check") not in (None, "ok"):
            note = f"check: {r['check']} {note}"
        note = note.replace("|", "/").replace("\n", " ")[:160]
        out.append(f"| {r['case']} | {r['op']} | {c(r.get('time_us'))} | {c(r.get('graph_us'))} | "
                   f"{_g(mb, 0).strip() if mb else ''} | "
                   f"{_g(r.get('gbps'), 0).strip() if r.get('gbps') else ''} | "
                   f"{c(pct)} | {c(same)} | {c(r.get('speedup_ref'))} | "
                   f"{r.get('timing') or ''} | {note} |")
    return out


def env_info(device: torch.device) -> Dict[str, Any]:
    info: Dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                            "device": str(device), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(gpu=p.name, cc=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                    gpu_mem_GiB=round(p.total_memory / 2**30, 1))
    try:
        import dsv4_ops
        info["dsv4_ops"] = getattr(dsv4_ops, "__version__", "?")
        info["dsv4_library"] = dsv4_ops.ops._library.LIBRARY_PATH
    except Exception as e:  # noqa: BLE001
        info["dsv4_ops_import_error"] = f"{type(e).__name__}: {e}"
    info["git"] = git_tree()
    info["DSV4_OPS_NO_PDL"] = os.environ.get("DSV4_OPS_NO_PDL")
    return info


def git_tree(root: str = REPO_ROOT) -> str:
    """'HEAD, tree T': the work tree's git HEAD and the git tree hash of its files as they are
    (tracked and untracked, less the ignored). A copied tree (the GPU machine's) may carry
    older git metadata than its files; T names the files themselves: it equals
    `git rev-parse COMMIT^{tree}` of the commit they match. '?' without git."""
    git = ["git", "-C", root]
    try:
        head = subprocess.check_output(git + ["rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
        with tempfile.TemporaryDirectory() as tmp:  # a scratch index: the real one is untouched
            env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
            subprocess.check_call(git + ["add", "-A", "."], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            tree = subprocess.check_output(git + ["write-tree"], env=env, text=True,
                                           stderr=subprocess.DEVNULL).strip()
        return f"{head}, tree {tree[:12]}"
    except Exception:  # noqa: BLE001
        return "?"


Cases = List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]


def family_rows(family: str, cases_fn: Callable[[Context], Cases]
                ) -> Callable[[Context], List[Dict[str, Any]]]:
    """The rows function of a family script (what benchmarks/run.py calls): the script's
    (name, thunk) cases through run_cases."""
    return lambda ctx: run_cases(ctx, cases_fn(ctx), family)


def family_main(family_name: str, rows_fn: Callable[[Context], List[Dict[str, Any]]],
                description: str) -> int:
    """main() of one family script: parse the common options, measure the copy ceiling,
    run the family, print its table."""
    ap = argparse.ArgumentParser(description=description)
    add_common_args(ap)
    args = ap.parse_args()
    ctx = context_from_args(args)
    info = env_info(ctx.device)
    log(" ".join(f"{k}={v}" for k, v in info.items()))
    ctx.measure_copy()
    log(TABLE_HEADER)
    try:
        rows = rows_fn(ctx)
    except DeviceLost as e:
        log(f"[{family_name}] device lost: {e}")
        return 3
    log("")
    for line in format_table([ctx.ceiling_row()] + rows):
        log(line)
    if ctx.skipped_for_time:
        log(f"[{family_name}] {len(ctx.skipped_for_time)} cases skipped (time budget)")
    return 1 if any(r.get("error") for r in rows) else 0
