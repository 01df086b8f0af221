"""The benchmark runner end to end on tiny shapes (`benchmarks/run.py --smoke --device cpu`):
every family's script runs, every row is measured without an error or a failed output check,
and the table is written. Timings are not asserted: performance targets live in benchmarks/."""
import json
import os
import re
import subprocess
import sys

import torch

from dsv4_ops.layout import KVLayout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_benchmark_runner_smoke(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--smoke",
                          "--device", "cpu", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {r["family"] for r in rows} >= {"plan", "compress", "store", "step", "fused",
                                           "low_ratio", "cp", "spec"}
    assert {r["op"] for r in rows} >= {
        "plan_decode", "plan_prefill_hostlens", "plan_prefill_devlens", "compress_decode",
        "compress_prefill", "store_decode", "store_prefill", "decode_step", "c1", "c1_prefill",
        "c2", "c2_verify", "c2_prefill", "index_k", "index_k_prefill", "kv_store", "cnrs",
        "cp_partials", "cp_merge_rebase", "cp_merge_rows", "cp_merge_stack", "dcp_store_w1",
        "dcp_store_w4", "dcp_c1_w1", "dcp_c1_w4", "spec_step", "spec_stage", "spec_commit",
        "fused_decode", "pair_decode", "fused_prefill", "fused_prefill_no_out", "pair_prefill",
        "compress_prefill"}
    bad = [(r["case"], r["op"], r["error"], r.get("check")) for r in rows
           if r["error"] or r.get("check") not in (None, "ok")]
    assert not bad, bad
    assert all(r["time_us"] > 0 for r in rows)
    # Every output check that the scripts make ran on some row of each op family.
    assert {r["family"] for r in rows if r.get("check") == "ok"} >= {"plan", "compress", "store",
                                                                   "fused", "low_ratio", "cp",
                                                                   "spec"}
    table = (tmp_path / "results.md").read_text()
    assert "compress_prefill" in table and "store_decode" in table
    _names_tree_not_date(table)


def test_benchmark_runner_beside_the_reference(tmp_path):
    """run.py --peer-selftest: the side-by-side scripts of the low_ratio, fused and spec
    families (their CPU stand-ins for the reference engine) end up in results.json ("peer")
    and results.md, every case timed on both sides and conforming."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "run.py"), "--smoke",
                          "--device", "cpu", "--families", "low_ratio,fused,spec",
                          "--peer-selftest", "--out", str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    peer = json.loads((tmp_path / "results.json").read_text())["peer"]
    assert {r["family"] for r in peer} == {"low_ratio", "fused", "spec"}
    bad = [r for r in peer if not (r["ours_us"] and r["ref_us"] and r["ratio"] and
                                   r["conform"] == "ok")]
    assert not bad, bad
    table = (tmp_path / "results.md").read_text()
    assert "## beside the reference engine" in table
    assert all(f"| {r['family']} | {r['case']} |" in table for r in peer)


def _low_ratio_case(op, layout, **kw):
    from benchmarks import peer_low_ratio as P

    return next(c for c in P.case_list(selftest=True, layouts=[layout] if layout else None)
                if c.op == op and all(getattr(c, k) == v for k, v in kw.items()))


def _low_ratio_pair(case):
    """The case's inputs and two runs of the oracle stand-in (identical outputs)."""
    from benchmarks import peer_low_ratio as P

    inp = P.build_inputs(case, "cpu")
    outs = []
    for _ in range(2):
        o = P.fresh_outputs(inp)
        P.call_fn(P.OracleStandIn(), inp, o)()
        outs.append(o)
    return inp, outs[0], outs[1]


def test_low_ratio_conformance_rules():
    """peer_low_ratio.conformance: equal runs conform; one 1-ulp latent element is allowed,
    a 2-ulp one, a changed cache byte of a row with equal latents, a changed state row or an
    unwritten cache are not; the cache bytes of a row whose latent differs are not compared."""
    from benchmarks import peer_low_ratio as P

    case = _low_ratio_case("c2_prefill", "v41_fp4")
    inp, ref, ours = _low_ratio_pair(case)
    assert P.conformance(inp, ref, ours)["ok"]
    row = int(P.written_rows(inp).nonzero()[0])
    bits = ours["latent"].view(torch.int16)

    one = {k: v.clone() for k, v in ours.items()}
    one["latent"].view(torch.int16)[row, 3] = bits[row, 3] + 1
    res = P.conformance(inp, ref, one)
    assert res["latent_1ulp"] == 1 and res["ok"]
    # a 1-ulp row's cache slot may differ: its bytes are left out of the comparison
    lay = KVLayout.parse(case.layout)
    at, _ = lay.token_offsets(int(inp["slot"][row]), case.page_size)
    one["cache"].view(-1)[at] ^= 1
    assert P.conformance(inp, ref, one)["ok"]

    two = {k: v.clone() for k, v in ours.items()}
    two["latent"].view(torch.int16)[row, 3] = bits[row, 3] + 2
    assert not P.conformance(inp, ref, two)["ok"]
    assert P.conformance(inp, ref, two, max_ulp=2)["ok"]

    byte = {k: v.clone() for k, v in ours.items()}
    byte["cache"].view(-1)[at] ^= 1
    res = P.conformance(inp, ref, byte)
    assert res["cache_bytes_differ"] == 1 and not res["ok"]

    state = {k: v.clone() for k, v in ours.items()}
    state["state"][0, 0] += 1
    assert not P.conformance(inp, ref, state)["ok"]

    empty = {k: v.clone() for k, v in ours.items()}
    empty["cache"].zero_()
    res = P.conformance(inp, {**ref, "cache": empty["cache"].clone()}, empty)
    assert res["slots_dsv4"] == 0 and not res["ok"]


def test_low_ratio_case_inputs():
    """The case builders: decode rows of both parities, raw_out_loc's parity following the
    position, distinct stored slots; verify blocks of consecutive positions; prefill requests
    with an odd first position; the byte model counts what the op must move."""
    from benchmarks import peer_low_ratio as P

    inp = P.build_inputs(_low_ratio_case("c2", "v4", bs=8), "cpu")
    pos, raw = inp["positions"], inp["raw_out_loc"]
    assert set((pos % 2).tolist()) == {0, 1} and torch.equal(pos % 2, raw % 2)
    assert (raw >= P.FULL_PAGE).all() and P.stored_slots(inp).unique().numel() == 4
    ver = P.build_inputs(_low_ratio_case("c2_verify", "v4", bs=4, draft_len=3), "cpu")
    blocks = ver["positions"].view(4, 3)
    assert (blocks[:, 1:] - blocks[:, :-1] == 1).all() and ver["req"].view(4, 3).unique(dim=1).shape[1] == 1
    pre = P.build_inputs(_low_ratio_case("c2_prefill", "v4"), "cpu")
    firsts = pre["positions"][pre["extend_start_loc"].long()]
    assert (firsts % 2 == 1).any() and (firsts % 2 == 0).any()
    n_odd = int((pre["positions"] % 2 == 1).sum())
    assert P.case_bytes(pre) > n_odd * (1024 + 584) + pre["n"] * 4096


def _selftest(module, tmp_path):
    """`python -m benchmarks.<module> --selftest --out tmp_path` from the project root,
    asserted to exit 0."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--selftest",
                          "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_low_ratio_selftest(tmp_path):
    """`python -m benchmarks.peer_low_ratio --selftest`: every case's inputs built at a tiny
    size, dsv4_ops run on the CPU and compared with the oracle stand-in; all conform."""
    _selftest("peer_low_ratio", tmp_path)
    rows = json.loads((tmp_path / "low_ratio.json").read_text())["joined"]
    assert {r["op"] for r in rows} == {"c1", "c1_prefill", "c2", "c2_verify", "c2_prefill",
                                       "index_k", "index_k_prefill", "kv_store", "cnrs"}
    assert all(r["conform"] == "ok" and not r["note"] for r in rows)
    table = (tmp_path / "low_ratio.md").read_text()
    assert "c2/v41_fp4/ps64/p3x40" in table
    _names_tree_not_date(table)


def _names_tree_not_date(table: str) -> None:
    """A generated table's header names the dsv4_ops files it measured (common.git_tree:
    'HEAD, tree T', '?' outside a git checkout) and no calendar date (a run's time stays in
    its JSON)."""
    head = "\n".join(table.splitlines()[:4])
    assert re.search(r"dsv4_ops (git )?(\w+, tree [0-9a-f]{12}|\?)", head), head
    assert not re.search(r"\d{4}-\d\d-\d\d", head), head


def test_store_match_verdict():
    """peer_store_match's check of two engines' fp8_ds_mla rows: dsv4_ops' CPU op against the
    model of the reference (its rsqrt correctly rounded) conforms; a UE8M0 byte off float64's,
    a code two steps off, or a rope value far off fails it."""
    import numpy as np

    from benchmarks import peer_store_match as S
    from benchmarks import store_reference_model as M

    x, w, pos, f, freqs = M.harness_like_tokens(256, seed=3)
    ours = M.op_rows(x, w, pos, freqs, 1e-6)
    ref = M.encode_rows(M.engine_y("reference", x, w, f, 1e-6))

    def check(rows):
        return S.compare_rows(x, pos, freqs, w, 1e-6, rows, ref)

    res = check(ours)
    assert res["verdict"]["ok"] and res["tokens"] == 256 and res["scale_diff"] == 0
    assert res["verdict"]["bytes_equal"] == (res["tokens_diff"] == 0)
    assert S.summary_line({"case": "c", **res}).endswith("conforms")

    def broken(edit):
        rows = {k: v.copy() for k, v in ours.items()}
        edit(rows)
        return check(rows)

    def scale(rows):
        rows["scales"][5, 2] += 1
        rows["data"][5, 128:192] = ref["data"][5, 128:192]

    bad = broken(scale)
    assert bad["scale_diff"] == 1 and not bad["verdict"]["scales_ok"] and not bad["verdict"]["ok"]
    code = int(ours["data"][7, 10])
    bad = broken(lambda r: r["data"].__setitem__((7, 10), (code & 0x80) | ((code & 0x7F) ^ 2)))
    assert bad["code_max_steps_same_scale"] == 2 and not bad["verdict"]["ok"]
    bad = broken(lambda r: r["data"].__setitem__((9, 449), r["data"][9, 449] ^ 0x40))
    assert bad["verdict"]["rope_outside_bound"] == 1 and not bad["verdict"]["ok"]


def test_fused_peer_selftest(tmp_path):
    """`python -m benchmarks.peer_fused --selftest`: every kernel's decode steps (closing and
    open) through the fused op, our pair and the float64 stand-in of the reference pair on
    the CPU; the fused call equals our pair bitwise and conforms to the stand-in."""
    _selftest("peer_fused", tmp_path)
    payload = json.loads((tmp_path / "fused.json").read_text())
    rows = payload["joined"]
    assert {(r["kernel"], r["pattern"]) for r in rows} == {
        (k, p) for k in ("main512_c4", "indexer128_c4", "main512_c128", "online512_c128")
        for p in ("bnd", "open")}
    assert all(r["pair_conform"] == "ok" and r["ref_conform"] == "ok" and not r["note"]
               for r in rows)
    closing = [r for r in payload["records"] if r["pattern"] == "bnd"]
    assert all(r["conformance"]["ref_tokens"]["tokens"] == r["batch"] for r in closing)
    assert "indexer128_c4_fp4_indexer/dec_bs3_bnd" in (tmp_path / "fused.md").read_text()


def test_fused_peer_fp4_verdict():
    """peer_fused.fp4_verdict: equal tokens conform; a code one step off conforms, two steps
    off does not; a differing UE8M0 byte conforms only where it is float64's."""
    import numpy as np

    from benchmarks import peer_fused as F

    gen = np.random.default_rng(5)
    ref = {"data": gen.integers(0, 256, (300, 64), dtype=np.uint8),
           "scales": gen.integers(100, 130, (300, 4), dtype=np.uint8)}
    exact = ref["scales"].copy()

    def verdict(edit):
        ours = {k: v.copy() for k, v in ref.items()}
        edit(ours)
        return F.fp4_verdict(ours, ref, exact)["verdict"]

    assert verdict(lambda o: None)["bytes_equal"]
    ref["data"][4, 9] = 0x33  # two codes of magnitude index 3 (1.5)
    assert verdict(lambda o: o["data"].__setitem__((4, 9), 0x34))["ok"]
    assert verdict(lambda o: o["data"].__setitem__((4, 9), 0x3A))["ok"] is False
    two = verdict(lambda o: o["data"].__setitem__((4, 9), 0x35))
    assert not two["ok"] and not two["codes_ok"]
    assert not verdict(lambda o: o["scales"].__setitem__((7, 2), o["scales"][7, 2] + 1))["ok"]
    exact[7, 2] += 1
    assert verdict(lambda o: o["scales"].__setitem__((7, 2), o["scales"][7, 2] + 1))["ok"]
