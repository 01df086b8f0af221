"""Context-parallel prefill (contract 8): compress_partials and merge_partials alone (the ranks
simulated in one process, on every device), dsv4_ops.distributed.cp_compress in real gloo
process groups of 2 and 4 ranks (torch.multiprocessing), followed by a DCP store of the merged
rows (contract 9), and the ops through PyTorch's machinery (opcheck, meta tensors,
torch.compile, torch.export, CUDA graphs; cp_compress itself captured in a CUDA graph over a
one-rank NCCL group). Cases and conformance: tests/cp_cases.py."""
import json
import math

import pytest
import torch
import torch.multiprocessing as mp

import dsv4_ops
from dsv4_ops import ops
from dsv4_ops.distributed import ContextParallelPlan, cp_compress, window_bound

import cp_cases as cc
import low_ratio_cases as lr
from op_samples import cp_samples
from sample_tests import assert_same_writes, clone, mutated, sample_tests

OPS = torch.ops.dsv4
NAMES = sorted(cc.CASES)

_BATCHES = {}


def _batch(name, device):
    """cc.build(...) with its single-rank result and oracle, made once per case and device."""
    key = (name, str(device))
    if key not in _BATCHES:
        b = cc.build(cc.CASES[name], device)
        _BATCHES[key] = (b, *cc.single_rank(b), cc.oracle(b))
    return _BATCHES[key]


def _ranks(b, parts, plan=None, **bounds):
    """Every rank's compress_partials: (partials [R, 3, W, hd], persist rows [R, Nw, row], the
    ranks' plans) of b.plan (or `plan`, cut to `bounds`); rank 0 reads the state."""
    dev, hd, cr = b.rows.device, b.case.head_dim, b.case.compress_ratio
    partials, persist, plans = [], [], []
    for r, mine in enumerate(parts):
        mine = mine.to(dev)
        cp = ContextParallelPlan.generate(b.plan if plan is None else plan, mine, b.num_q,
                                          read_state=r == 0, **bounds)
        p = torch.empty((3, cp.plan_c.shape[0], hd), device=dev)
        t = b.rows.new_empty((cp.plan_w.shape[0], b.rows.shape[1]))
        ops.compress_partials_op(b.state, b.rows[mine].contiguous(), cp.input_rows, b.world.ape,
                                 cp.plan_c, cp.plan_w, p, t, hd, cr, cp.read_state)
        partials.append(p)
        persist.append(t)
        plans.append(cp)
    return torch.stack(partials), torch.stack(persist), plans


def _merged(partials, out_dtype=torch.float32):
    out = partials.new_empty(partials.shape[2:], dtype=out_dtype)
    ops.merge_partials_op(partials, None, out)
    return out


def _sum_bits(rows):
    """The exchange of the persisted rows: their bits summed as int32 over the ranks."""
    return rows.view(torch.int32).sum(0, dtype=torch.int32).view(rows.dtype)


# ---- the two ops alone ----------------------------------------------------------------------

@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("how", cc.SPLITS)
@pytest.mark.parametrize("name", NAMES)
def test_merged_partials_equal_single_rank(device, name, how, ranks):
    """The ranks' partials merged: compress_forward's rows within 1e-6, the oracle's within
    1e-4; the persisted rows exchanged and written: compress_forward's state, bit for bit."""
    b, want, want_state, want_oracle = _batch(name, device)
    partials, persist, plans = _ranks(b, cc.split(b.num_q, ranks, how, seed=b.case.seed))
    state = b.state.clone()
    ops.compress_forward_op(state, _sum_bits(persist), b.world.ape, plans[0].plan_c[:0],
                            plans[0].persist_plan, want[:0].clone(), b.case.head_dim,
                            b.case.compress_ratio, False)
    assert cc.compare(_merged(partials), state, want, want_state, want_oracle) == []


@pytest.mark.parametrize("name", NAMES)
def test_all_reduce_steps_equal_single_rank(device, name):
    """cp_compress's local steps with the collectives done by hand: the MAX of m, each rank's
    partial rebased to it (merge_partials with max_m, into a partial), the SUM of s | k, the
    merge of that one partial into rows."""
    b, want, _, _ = _batch(name, device)
    partials, _, _ = _ranks(b, cc.split(b.num_q, 3, "scattered", seed=5))
    max_m = partials[:, 0].amax(0)
    rebased = torch.empty_like(partials)
    for r in range(partials.shape[0]):
        ops.merge_partials_op(partials[r:r + 1], max_m, rebased[r])
        assert torch.equal(rebased[r, 0], max_m)
    total = rebased[:1].clone()
    total[0, 1:] = rebased[:, 1:].sum(0)
    torch.testing.assert_close(_merged(total), want, rtol=cc.RTOL, atol=cc.ATOL)


@pytest.mark.parametrize("name", ["c4_hd512", "c128_hd512"])
def test_a_rank_without_rows_gives_empty_partials(device, name):
    """A rank's partial of a window it holds no row of is exactly (-inf, 0, 0); the rank that
    holds every row and reads the state gives compress_forward's rows by itself; a rank that
    holds no input row but reads the state has partials exactly where windows read the state."""
    b, want, _, _ = _batch(name, device)
    q = torch.arange(b.num_q)
    partials, persist, _ = _ranks(b, [q, q[:0], q[:0]])
    for r in (1, 2):
        assert bool((partials[r, 0] == -math.inf).all())
        assert not bool(partials[r, 1:].any())
        assert not bool(persist[r].view(torch.int32).any())
    torch.testing.assert_close(_merged(partials[:1]), want, rtol=cc.RTOL, atol=cc.ATOL)
    partials, _, _ = _ranks(b, [q[:0], q])
    reads_state = ((b.plan.plan_c.view(torch.int32)[:, 1] >> 16) & 0xFFFF).cpu() > 0
    held = (partials[0, 0] > -math.inf).cpu()
    assert bool(held.any()) and not bool((held.any(1) & ~reads_state).any())
    assert torch.equal(held.all(1), held.any(1))  # a window: every channel or none


@pytest.mark.parametrize("name", ["c4_hd128_ring16", "c128_hd512"])
def test_padded_plan_cut_to_its_bounds(device, name):
    """A CUDA-graph (padded) plan cut to window_bound windows and num_q persisted rows: the
    valid windows' rows as with the trimmed plan, zeros for the invalid ones (as
    compress_forward writes them), the same state."""
    b, want, want_state, _ = _batch(name, device)
    c = b.case
    seq = torch.tensor([s for s, _ in c.requests])
    ext = torch.tensor([e for _, e in c.requests])
    padded = cc.plan_for(b.world, seq.to(b.rows.device), ext.to(b.rows.device), padded=True)
    bound = window_bound(b.num_q, len(c.requests), c.compress_ratio)
    partials, persist, plans = _ranks(b, cc.split(b.num_q, 2, "rr128"), padded,
                                      max_windows=bound, max_persist=b.num_q)
    assert partials.shape[2] == bound > want.shape[0]
    out = _merged(partials)
    state = b.state.clone()
    ops.compress_forward_op(state, _sum_bits(persist), b.world.ape, plans[0].plan_c[:0],
                            plans[0].persist_plan, want[:0].clone(), c.head_dim,
                            c.compress_ratio, False)
    assert cc.compare(out[:want.shape[0]], state, want, want_state) == []
    assert not bool(out[want.shape[0]:].any())


def test_persisted_rows_are_the_plan_rows(device):
    """persist_rows: bit for bit the kv_score rows plan_w persists, each on the rank that holds
    it, zeros on the others (their int32 sum is the row)."""
    b, _, _, _ = _batch("c4_hd128_bf16", device)
    partials, persist, plans = _ranks(b, cc.split(b.num_q, 4, "scattered", seed=9))
    ragged = plans[0].plan_w.view(torch.int32)[:, 0].long()
    assert bool((ragged >= 0).all()) and ragged.numel() > 0
    assert torch.equal(_sum_bits(persist).view(torch.int16), b.rows[ragged].view(torch.int16))
    owners = (persist.view(torch.int16) != 0).any(-1).sum(0)
    assert bool((owners <= 1).all())


def test_merge_semantics(device):
    """merge_partials on hand-made partials: all-empty pools to 0, a NaN partial stays NaN, a
    single partial is itself (out = k / s), max_m rebases (M = max(max_m, m)) and bf16 rows
    are the rounded fp32 rows."""
    inf, nan = math.inf, math.nan
    # one window of four channels: (m, s, k) of rank 0 and of rank 1
    r0 = [[(-inf, 0, 0), (1.0, 2.0, 3.0), (0.5, 1.0, -1.0), (inf, nan, nan)]]
    r1 = [[(-inf, 0, 0), (-inf, 0, 0), (2.5, 3.0, 6.0), (0.0, 1.0, 1.0)]]
    p = torch.tensor([r0, r1], dtype=torch.float32).permute(0, 3, 1, 2).contiguous().to(device)
    out = _merged(p).cpu()
    e = math.exp(0.5 - 2.5)
    want = torch.tensor([[0.0, 1.5, (-1.0 * e + 6.0) / (1.0 * e + 3.0), nan]])
    torch.testing.assert_close(out, want, rtol=1e-6, atol=0, equal_nan=True)
    assert out[0, 3].view(torch.int32) == 0x7FC00000  # the canonical NaN
    assert torch.equal(_merged(p[:1]).cpu()[0, :3], torch.tensor([0.0, 1.5, -1.0]))
    torch.testing.assert_close(_merged(p, torch.bfloat16).cpu().float(),
                               want.bfloat16().float(), equal_nan=True, rtol=0, atol=0)
    floor = torch.full((1, 4), 2.0, device=device)
    rebased = torch.empty((3, 1, 4), device=device)
    ops.merge_partials_op(p[:1], floor, rebased)
    r = rebased.cpu()
    assert r[0, 0].tolist()[:3] == [2.0, 2.0, 2.0] and r[0, 0, 3] == inf
    torch.testing.assert_close(r[1:, 0, 1], torch.tensor([2.0, 3.0]) * math.exp(-1.0))
    assert r[1, 0, 0] == 0 and r[2, 0, 0] == 0


def test_window_bound_covers_every_plan():
    """window_bound >= the valid plan_c rows of the cases (and of extreme batches)."""
    for name in NAMES:
        b = _batch(name, "cpu")[0]
        c = b.case
        assert b.plan.plan_c.shape[0] <= window_bound(b.num_q, len(c.requests), c.compress_ratio)
    assert window_bound(8, 8, 4) == 8 and window_bound(4096, 1, 128) == 33


def test_exchanged_bytes(device):
    """ContextParallelPlan.exchanged_bytes: 3 fp32 planes of W x hd plus the persisted rows."""
    b, _, _, _ = _batch("c128_hd512", device)
    cp = ContextParallelPlan.generate(b.plan, torch.arange(b.num_q), b.num_q)
    w, nw = cp.plan_c.shape[0], cp.plan_w.shape[0]
    assert cp.exchanged_bytes(512, 4) == 3 * w * 512 * 4 + nw * 1024 * 4


# ---- real process groups ----------------------------------------------------------------------

@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def group_results(request, tmp_path_factory):
    """Every case and split through cp_compress on a gloo group of `params` ranks (spawned
    once per group size): {(rank, "case/split"): failures}."""
    ranks = request.param
    tmp = tmp_path_factory.mktemp(f"cp{ranks}")
    mp.spawn(cc.worker, args=(ranks, str(tmp / "init"), str(tmp), NAMES), nprocs=ranks,
             join=True)
    results = {}
    for r in range(ranks):
        with open(tmp / f"rank{r}.json") as f:
            results.update({(r, k): v for k, v in json.load(f).items()})
    return ranks, results


@pytest.mark.parametrize("how", cc.SPLITS)
@pytest.mark.parametrize("name", NAMES)
def test_cp_compress_in_a_process_group(group_results, name, how):
    """On every rank: the rows within 1e-6 of compress_forward's and 1e-4 of the oracle's, the
    state bit for bit compress_forward's."""
    ranks, results = group_results
    for r in range(ranks):
        assert (r, f"{name}/{how}") in results, f"rank {r} did not run {name}/{how}"
        assert results[(r, f"{name}/{how}")] == [], f"rank {r} of {ranks}"


@pytest.mark.parametrize("name", NAMES)
def test_dcp_store_in_a_process_group(group_results, name):
    """Each rank stores its share of the merged rows (DCP, contract 9): the all-gathered union
    of the ranks' caches is the single-rank cache, and no rank writes outside its slots."""
    ranks, results = group_results
    for r in range(ranks):
        assert (r, f"{name}/dcp_store") in results, f"rank {r} did not run {name}/dcp_store"
        assert results[(r, f"{name}/dcp_store")] == [], f"rank {r} of {ranks}"


# ---- the ops through PyTorch's machinery -------------------------------------------------------

SAMPLES = sorted(cp_samples("cpu"))


test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors, \
    test_compiled_equals_eager = sample_tests(cp_samples)


class _PartialsThenMerge(torch.nn.Module):
    """One rank's partials and their merge into rows (a one-rank group), one program."""

    def __init__(self, hd, cr, read_state):
        super().__init__()
        self.hd, self.cr, self.read_state = hd, cr, read_state

    def forward(self, state, rows, input_rows, ape, plan_c, plan_w):
        partials = torch.empty((1, 3, plan_c.shape[0], self.hd), device=rows.device)
        persist = rows.new_empty((plan_w.shape[0], rows.shape[1]))
        OPS.compress_partials(state, rows, input_rows, ape, plan_c, plan_w, partials[0], persist,
                              self.hd, self.cr, self.read_state)
        out = torch.empty((plan_c.shape[0], self.hd), device=rows.device)
        OPS.merge_partials(partials, None, out)
        return out, persist


def test_exported_equals_eager(device):
    op, args = cp_samples(device)["compress_partials_c4"]
    state, rows, input_rows, ape, plan_c, plan_w, _, _, hd, cr, read_state = args
    module = _PartialsThenMerge(hd, cr, read_state)
    inputs = (state, rows, input_rows, ape, plan_c, plan_w)
    ep = torch.export.export(module, tuple(t.clone() for t in inputs))
    names = {n.target.name() for n in ep.graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "dsv4"}
    assert names == {"dsv4::compress_partials", "dsv4::merge_partials"}, names
    for got, want in zip(ep.module()(*inputs), module(*inputs)):
        lr.assert_same_bits(got, want, "exported")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SAMPLES)
def test_cuda_graph_replay_equals_eager(name):
    """Capture the launch, refill its float inputs in place, replay: eager's bytes."""
    from test_cuda_graph import _capture

    op, args = cp_samples(torch.device("cuda", 0))[name]
    written = mutated(op, args)
    static = clone(args)
    graph, _ = _capture(lambda: op(*static))
    gen = torch.Generator(device="cuda").manual_seed(3)
    for _ in range(2):
        for i, a in enumerate(static):
            if isinstance(a, torch.Tensor) and i not in written and a.dtype == torch.float32:
                a.normal_(generator=gen)
        eager = clone(static)
        graph.replay()
        op(*eager)
        torch.cuda.synchronize()
        assert_same_writes(op, static, eager, f"{name} graph replay")


def _nccl_graph_worker(rank, init_file, result_file):
    """cp_compress captured in a CUDA graph on a one-rank NCCL group, replayed after its rows
    change: eager's rows and state, and compress_forward's within 1e-6."""
    import torch.distributed as dist

    from test_cuda_graph import _capture

    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    failures = []
    try:
        b = cc.build(cc.CASES["c128_hd512"], "cuda")
        hd, cr = b.case.head_dim, b.case.compress_ratio
        cp = ContextParallelPlan.generate(b.plan, torch.arange(b.num_q, device="cuda"), b.num_q)
        rows, state = b.rows.clone(), b.state.clone()
        out = torch.empty((cp.plan_c.shape[0], hd), device="cuda")

        def step():
            cp_compress(state, rows, b.world.ape, cp, head_dim=hd, compress_ratio=cr, out=out)

        graph, _ = _capture(step)
        rows.normal_(generator=torch.Generator(device="cuda").manual_seed(1))
        state.copy_(b.state)
        graph.replay()
        got, got_state = out.clone(), state.clone()
        state.copy_(b.state)
        step()
        if not (torch.equal(got, out) and torch.equal(got_state, state)):
            failures.append("replay differs from eager")
        want, want_state = cc.single_rank(b._replace(rows=rows))
        failures += cc.compare(got, got_state, want, want_state)
    finally:
        with open(result_file, "w") as f:
            json.dump(failures, f)
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cp_compress_captures_in_a_cuda_graph_with_nccl(tmp_path):
    mp.spawn(_nccl_graph_worker, args=(str(tmp_path / "init"), str(tmp_path / "r.json")),
             nprocs=1, join=True)
    assert json.loads((tmp_path / "r.json").read_text()) == []


def test_cp_plan_checks_its_plan():
    with pytest.raises(TypeError, match="ContextParallelPlan.generate: plan must be"):
        ContextParallelPlan.generate(torch.zeros(4, 16, dtype=torch.uint8), torch.arange(2), 2)
    b = _batch("c4_hd128", "cpu")[0]
    cp = ContextParallelPlan.generate(b.plan, torch.arange(b.num_q), b.num_q)
    with pytest.raises(ValueError, match=r"dsv4\.cp_compress: compress_ratio=128"):
        cp_compress(b.state, b.rows, b.world.ape, cp, head_dim=128, compress_ratio=128)


def test_read_state_defaults_to_true_without_a_group():
    b = _batch("c4_hd128", "cpu")[0]
    assert ContextParallelPlan.generate(b.plan, torch.arange(3), b.num_q).read_state
    assert not ContextParallelPlan.generate(b.plan, torch.arange(3), b.num_q,
                                            read_state=False).read_state
