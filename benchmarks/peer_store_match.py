#!/usr/bin/env python3
"""fp8_ds_mla cache bytes of the two engines on the same kv rows (docs/design/store_reference_match.md).

For a head_dim-512 case of the peer harness: one World as the harness's Bench builds it (same
seed), the reference engine's compress_forward output as the kv rows of both stores, one random
cache background given to both, each engine's own plan (the rows must agree); then, per stored
token, the UE8M0 bytes, e4m3 codes and rope bf16 values of the two engines compared exactly and
against float64 (benchmarks/store_reference_model.py), and every byte outside the stored slots
checked untouched. For contrast (`own_kv`), dsv4_ops' store of its own compress_forward output
against the reference's bytes, and how far the two engines' kv rows differ. peer_compare.py calls `match_case` for every such case; run alone, this
script also writes the stored tokens' kv rows and both engines' bytes for offline analysis, and
a table of the GPU's rsqrtf (the reference's normalisation factor):

    PYTHONPATH=PEER/stubs:SITE python3 -m benchmarks.peer_store_match --peer-dir PEER --out DIR
    python3 -m benchmarks.store_reference_model --dump DIR

Conformance (`verdict`): the bytes equal, or else within docs/contract.md 4 as arbitrated by
float64: every differing UE8M0 byte of dsv4_ops the one of the float64 values, codes of equal
scales at most one step apart on at most 0.5 % of them, every rope value of dsv4_ops within 1
bf16 ulp of the float64 value or within 2^-16 of its token's largest |value|.
Files (--out): store_dump_<case>.npz (kv [n, 512] fp32, pos, loc, norm_weight, freqs
[max_pos, 64], eps, sglang_data / dsv4_data [n, 576], sglang_scales / dsv4_scales [n, 8],
selected: the tokens' indices among the case's stored tokens, all of them unless the file would
pass --max-mib: then every token whose bytes differ and a random sample of the others),
rsqrt_table.npz (store_reference_model.RsqrtTable), store_match.json (every case's comparison
over all its tokens).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import zlib
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import store_reference_model as M

DEFAULT_CASES = ("main512_c4_fp32/p8x4096", "main512_c4_fp32/p4x2000+2048")
CODE_SLACK = 0.005  # contract 4: codes one step apart on at most 0.5 % of them
ROPE_CANCEL = 2.0 ** -16  # contract 4: rope values where the rotation cancels


def log(*a: Any) -> None:
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------------------
def _bench(H, api, dev):
    return H.Bench(SimpleNamespace(), torch, api, {}, dev=dev, timer=H._FakeTimer())


def world(H, name: str, combo, reqs, state_dtype, dev, kv_layout):
    """The World the harness's Bench.run_case builds for this case."""
    _, hd, r = combo
    return H.World(torch, ratio=r, head_dim=hd, reqs=reqs, state_dtype=state_dtype, device=dev,
                   seed=zlib.crc32(name.encode()) % (1 << 30), kv_layout=kv_layout)


def stored_tokens(H, w, plan, mode: str) -> Dict[str, torch.Tensor]:
    """Plan rows that store a token (contract 4), their RoPE positions and cache locations."""
    rec = H.plan_rows(plan[1], 4).cpu().to(torch.int64)
    seq = rec[:, 0] & 0xFFFFFFFF
    out_loc = w.out_loc.cpu().to(torch.int64)
    if mode == "decode":
        rows = ((seq % w.ratio == 0) & (rec[:, 1] >= 0)).nonzero().flatten()
        loc = out_loc[rows]
    else:
        rows = (seq != 0xFFFFFFFF).nonzero().flatten()
        loc = out_loc[rec[rows, 1] & 0xFFFF]
    keep = loc >= 0
    return {"rows": rows[keep], "pos": (seq[rows] - w.ratio)[keep], "loc": loc[keep]}


def slot_bytes(cache: torch.Tensor, loc: torch.Tensor, ps: int):
    """(data [n, 576], scales [n, 8]) of slots loc, and a mask of every byte of those slots."""
    flat = cache.reshape(cache.shape[0], -1)
    page, off = loc // ps, loc % ps
    dcol = off[:, None] * 576 + torch.arange(576)
    scol = 576 * ps + off[:, None] * 8 + torch.arange(8)
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[page[:, None], dcol] = True
    mask[page[:, None], scol] = True
    return flat[page[:, None], dcol], flat[page[:, None], scol], mask


def rope_conformance(ours: Dict[str, np.ndarray], y64: np.ndarray) -> int:
    """Rope values of `ours` (decode() fields) outside contract 4's bound against float64."""
    exact = M.bf16_round64(y64[:, M.NOPE:])
    ord_e = M._ordinal(M.bits(exact.astype(M.F32)) >> 16, 0x8000)
    ulps = np.abs(M._ordinal(ours["rope"], 0x8000) - ord_e)
    amax = np.abs(y64).max(axis=1, keepdims=True)
    near = np.abs(ours["rope_val"] - y64[:, M.NOPE:]) <= ROPE_CANCEL * amax
    return int(((ulps > 1) & ~near).sum())


def verdict(cmp: Dict[str, Any], ours: Dict[str, np.ndarray], y64: np.ndarray) -> Dict[str, Any]:
    """Exact equality of the engines' bytes, and conformance (module docstring) where they
    differ. cmp: store_reference_model.compare(ours, reference, y64)."""
    exact = (cmp["scale_diff"] == 0 and cmp["code_diff"] == 0 and cmp["rope_diff"] == 0)
    scales_ok = cmp["scale_equal_exact"]["a"] == cmp["scale_diff"]
    codes_ok = (cmp["code_max_steps_same_scale"] <= 1
                and cmp["code_diff_same_scale"] <= CODE_SLACK * cmp["codes"])
    rope_bad = rope_conformance(ours, y64)
    return {"bytes_equal": exact, "ok": exact or (scales_ok and codes_ok and rope_bad == 0),
            "scales_ok": scales_ok, "codes_ok": codes_ok, "rope_outside_bound": rope_bad}


def compare_rows(kv: np.ndarray, pos: np.ndarray, freqs: np.ndarray, norm_weight: np.ndarray,
                 eps: float, dsv4: Dict[str, np.ndarray], sglang: Dict[str, np.ndarray]
                 ) -> Dict[str, Any]:
    """The comparison of the two engines' rows ({'data', 'scales'} uint8) of the same tokens."""
    y64 = M.norm_rope64(kv, norm_weight, freqs[pos], eps)
    a, b = M.decode(dsv4["data"], dsv4["scales"]), M.decode(sglang["data"], sglang["scales"])
    cmp = M.compare(a, b, y64)
    cmp["worst_rope"] = M.worst_rope(a, b, y64, kv, pos)
    cmp["verdict"] = verdict(cmp, a, y64)
    return cmp


def match_case(H, apis: Dict[str, Any], name: str, combo, reqs, state_dtype, mode: str, dev,
               keep_rows: bool = False) -> Dict[str, Any]:
    """Both engines' fp8_ds_mla stores of one harness case on the reference's kv rows."""
    w = world(H, name, combo, reqs, state_dtype, dev, apis["sglang"].KVLayout.V4)
    benches = {k: _bench(H, api, dev) for k, api in apis.items()}
    plans = {}
    for k, b in benches.items():
        plans[k] = b.plan_decode(w) if mode == "decode" else b.plan_prefill(w, gpu_inputs=False)
    state0 = w.state.clone()
    kv = benches["sglang"].compress(w, plans["sglang"])
    rows_s = H.plan_rows(plans["sglang"][1], 4).cpu()
    rows_d = H.plan_rows(plans["dsv4"][1], 4).cpu()
    if not torch.equal(rows_s, rows_d):
        raise RuntimeError(f"{name}: the engines' plans differ; the kv rows would not line up")
    gen = torch.Generator(device=dev).manual_seed(zlib.crc32(name.encode()) % (1 << 30) + 7)
    background = torch.randint(0, 256, w.kvcache.shape, dtype=torch.uint8, device=dev,
                               generator=gen)
    caches = {}
    for k, b in benches.items():
        w.kvcache = background.clone()
        b.store(w, kv, plans[k])
        caches[k] = w.kvcache.cpu()
    tok = stored_tokens(H, w, plans["dsv4"], mode)
    ps = w.kv_page_size
    # Each engine's store of its own compress_forward output (what a side-by-side run compares
    # when it does not share the kv rows): how far the rows and the bytes then differ.
    w.state.copy_(state0)
    kv_own = benches["dsv4"].compress(w, plans["dsv4"])
    w.kvcache = background.clone()
    benches["dsv4"].store(w, kv_own, plans["dsv4"])
    own = w.kvcache.cpu()
    sel = tok["rows"].to(kv.device)
    dkv = (kv_own[sel].double() - kv[sel].double()).abs()
    rows = {}
    for k, c in caches.items():
        data, scales, mask = slot_bytes(c, tok["loc"], ps)
        rows[k] = {"data": data.numpy(), "scales": scales.numpy(), "mask": mask}
    bg = background.cpu().reshape(background.shape[0], -1)
    outside = ~rows["dsv4"]["mask"]
    res: Dict[str, Any] = {"case": name, "tokens": int(tok["loc"].numel())}
    res["outside_changed"] = {k: int((caches[k].reshape(bg.shape)[outside] != bg[outside]).sum())
                              for k in caches}
    res["byte7_equal"] = bool(np.array_equal(rows["dsv4"]["scales"][:, 7],
                                             rows["sglang"]["scales"][:, 7]))
    x = kv[tok["rows"].to(kv.device)].float().cpu().numpy()
    pos = tok["pos"].numpy()
    freqs = torch.view_as_real(w.freqs).reshape(w.freqs.shape[0], -1).float().cpu().numpy()
    nw = w.norm_w.float().cpu().numpy()
    res.update(compare_rows(x, pos, freqs, nw, H.NORM_EPS,
                            *({"data": rows[k]["data"], "scales": rows[k]["scales"][:, :7]}
                              for k in ("dsv4", "sglang"))))
    od, osc, _ = slot_bytes(own, tok["loc"], ps)
    own_cmp = M.compare(M.decode(od.numpy(), osc.numpy()[:, :7]),
                        M.decode(rows["sglang"]["data"], rows["sglang"]["scales"][:, :7]))
    own_cmp.update(kv_max_abs_diff=float(dkv.max()) if dkv.numel() else 0.0,
                   kv_max_rel_diff=float((dkv / kv[sel].double().abs().clamp(min=1e-30)).max())
                   if dkv.numel() else 0.0,
                   kv_elements_differ=float((dkv != 0).double().mean()) if dkv.numel() else 0.0)
    res["own_kv"] = own_cmp
    res["verdict"]["ok"] = (res["verdict"]["ok"] and res["byte7_equal"]
                            and not any(res["outside_changed"].values()))
    if keep_rows:
        res["arrays"] = {"kv": x, "pos": pos, "loc": tok["loc"].numpy(), "norm_weight": nw,
                         "freqs": freqs, "eps": np.float64(H.NORM_EPS),
                         "sglang_data": rows["sglang"]["data"],
                         "sglang_scales": rows["sglang"]["scales"],
                         "dsv4_data": rows["dsv4"]["data"], "dsv4_scales": rows["dsv4"]["scales"]}
    return res


def summary_line(res: Dict[str, Any]) -> str:
    """The case's conformance line."""
    v = res.get("verdict", {})
    if "error" in res:
        return f"{res['case']}: store match ERROR {res['error']}"
    head = "bytes equal" if v.get("bytes_equal") else (
        f"scale bytes {res['scale_diff']}/{res['scale_bytes']} differ, codes {res['code_diff']}/"
        f"{res['codes']} ({res['code_diff_same_scale']} in groups of equal scales, "
        f"{res['code_diff_in_rescaled_groups']} in rescaled groups), rope values "
        f"{res['rope_diff']}/{res['rope_values']} (max {res['rope_max_ulps']} ulps)")
    near = ""
    if not v.get("bytes_equal"):
        rn, cn, se = res["rope_nearer_exact"], res["code_nearer_exact"], res["scale_equal_exact"]
        near = (f"; nearer fp64 dsv4/sglang/tie: rope {rn['a_closer']}/{rn['b_closer']}/{rn['tie']},"
                f" codes {cn['a_closer']}/{cn['b_closer']}/{cn['tie']}; differing scales equal to"
                f" fp64's: dsv4 {se['a']}, sglang {se['b']}")
    own = res.get("own_kv")
    own_s = "" if own is None else (
        f" [each engine's own kv rows (max |diff| {own['kv_max_abs_diff']:.2e}): scale bytes "
        f"{own['scale_diff']}, codes {own['code_diff']}, rope values {own['rope_diff']} (max "
        f"{own['rope_max_ulps']} ulps) differ]")
    return (f"{res['case']}: fp8_ds_mla vs reference on {res['tokens']} tokens: {head}{near}; "
            f"{'conforms' if v.get('ok') else 'DOES NOT CONFORM'}{own_s}")


def markdown(results: List[Dict[str, Any]]) -> List[str]:
    lines = ["| case | tokens | scale bytes differ | codes differ (equal scales / rescaled) | "
             "rope values differ (max ulps) | nearer fp64 dsv4 / sglang (rope; codes) | verdict |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['case']} | | | | | | error: {str(r['error'])[:80]} |")
            continue
        rn, cn = r["rope_nearer_exact"], r["code_nearer_exact"]
        v = r["verdict"]
        lines.append(
            f"| {r['case']} | {r['tokens']} | {r['scale_diff']} | {r['code_diff']} "
            f"({r['code_diff_same_scale']} / {r['code_diff_in_rescaled_groups']}) | "
            f"{r['rope_diff']} ({r['rope_max_ulps']}) | {rn['a_closer']} / {rn['b_closer']}; "
            f"{cn['a_closer']} / {cn['b_closer']} | "
            f"{'bytes equal' if v['bytes_equal'] else ('conforms' if v['ok'] else 'FAILS')} |")
    return lines


class ReferenceModelStore:
    """A CPU stand-in for the reference engine (peer_compare.py --selftest-cpu): the harness's
    stand-in API (plans, float64 pooling) with the store of store_reference_model's reference
    arithmetic (its rsqrt correctly rounded), so that match_case compares real bytes."""

    def __init__(self, api):
        self._api = api
        self.KVLayout = api.KVLayout
        self.CompressorDecodePlan = api.CompressorDecodePlan
        self.CompressorPrefillPlan = api.CompressorPrefillPlan
        self.compress_forward = api.compress_forward

    @staticmethod
    def compress_norm_rope_store(kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc, kvcache,
                                 page_size, **_):
        rec = plan[1].contiguous().view(torch.int32).view(-1, 4).to(torch.int64)
        seq = rec[:, 0] & 0xFFFFFFFF
        if len(plan) == 2:  # the stand-in's decode plan: (ratio, records)
            rows = (seq % plan[0] == 0).nonzero().flatten()
            loc = out_loc[rows]
        else:
            rows = (seq != 0xFFFFFFFF).nonzero().flatten()
            loc = out_loc[rec[rows, 1] & 0xFFFF]
        keep = loc >= 0
        rows, loc = rows[keep], loc[keep].to(torch.int64)
        pos = (seq[rows] - plan[0]).numpy()
        freqs = torch.view_as_real(freq_cis).reshape(freq_cis.shape[0], -1).numpy()
        x = kv[rows].float().numpy()
        y = M.engine_y("reference", x, norm_weight.float().numpy(), freqs[pos], norm_eps)
        enc = M.encode_rows(y)
        flat = kvcache.view(kvcache.shape[0], -1)
        page, off = loc // page_size, loc % page_size
        flat[page[:, None], off[:, None] * 576 + torch.arange(576)] = torch.from_numpy(enc["data"])
        flat[page[:, None], 576 * page_size + off[:, None] * 8 + torch.arange(7)] = \
            torch.from_numpy(enc["scales"])


# ---------------------------------------------------------------------------------------
# The GPU's rsqrtf, for the model
# ---------------------------------------------------------------------------------------
def rsqrt_table(dev) -> Dict[str, np.ndarray]:
    """rsqrtf (the reference's math::rsqrt: rsqrt.approx.f32, MUFU.RSQ) of every fp32 in
    [1, 4), as ulps from fp32(1.0 / sqrt(double x)); the rule rsqrt(x * 4^k) = rsqrt(x) / 2^k
    checked on 2^20 random (x, k); torch.rsqrt compared with it."""
    first = M.TABLE_FIRST
    u = torch.arange(first, first + (1 << 24), dtype=torch.int64, device=dev).to(torch.int32)
    x = u.view(torch.float32)
    try:
        fn = torch.cuda.jiterator._create_jit_fn(
            "template <typename T> T hw_rsqrt(T x) { return rsqrtf(x); }")
        hw, how = fn(x), "jiterator rsqrtf"
    except Exception as e:  # noqa: BLE001 (torch's own rsqrt kernel calls rsqrtf too)
        hw, how = torch.rsqrt(x), f"torch.rsqrt (jiterator failed: {type(e).__name__})"
    base = (1.0 / torch.sqrt(x.double())).float()
    dev_ulps = hw.view(torch.int32).to(torch.int64) - base.view(torch.int32).to(torch.int64)
    if int(dev_ulps.abs().max()) > 127:
        raise RuntimeError(f"rsqrtf is {int(dev_ulps.abs().max())} ulps off: not an int8 table")
    g = torch.Generator(device=dev).manual_seed(1)
    idx = torch.randint(0, 1 << 24, (1 << 20,), device=dev, generator=g)
    k = torch.randint(-40, 41, (1 << 20,), device=dev, generator=g)
    xs = x[idx] * torch.exp2(2.0 * k.float())
    fn_hw = (lambda t: fn(t)) if how.startswith("jiterator") else torch.rsqrt
    scaled_ok = fn_hw(xs) == hw[idx] * torch.exp2(-k.float())
    check = torch.randint(0, 1 << 24, (1 << 16,), device=dev, generator=g)
    hist = {int(d): int(c) for d, c in zip(*torch.unique(dev_ulps, return_counts=True))}
    return {"dev": dev_ulps.to(torch.int8).cpu().numpy(),
            "check_index": check.cpu().numpy(),
            "check_base_bits": base[check].view(torch.int32).cpu().numpy().view(np.uint32),
            "meta_function": np.array(how),
            "meta_torch_rsqrt_differs": np.int64(int((torch.rsqrt(x) != hw).sum())),
            "meta_scaling_rule_failures": np.int64(int((~scaled_ok).sum())),
            "meta_ulps_histogram": np.array(json.dumps(hist)),
            "meta_device": np.array(torch.cuda.get_device_name(dev))}


# ---------------------------------------------------------------------------------------
# CLI: the named cases, their rows and the table into --out
# ---------------------------------------------------------------------------------------
def _select(res: Dict[str, Any], max_bytes: int, seed: int) -> np.ndarray:
    a = res["arrays"]
    n = a["kv"].shape[0]
    per = a["kv"].shape[1] * 4 + 2 * (576 + 8) + 24
    cap = max(1, (max_bytes - a["freqs"].nbytes) // per)
    if n <= cap:
        return np.arange(n)
    diff = ((a["dsv4_data"] != a["sglang_data"]).any(1)
            | (a["dsv4_scales"] != a["sglang_scales"]).any(1))
    d, same = np.flatnonzero(diff), np.flatnonzero(~diff)
    rng = np.random.default_rng(seed)
    if d.size >= cap:
        return np.sort(rng.choice(d, cap, replace=False))
    return np.sort(np.concatenate([d, rng.choice(same, cap - d.size, replace=False)]))


def save_case(res: Dict[str, Any], out_dir: str, max_mib: float) -> str:
    """Writes match_case(keep_rows=True)'s arrays to out_dir/store_dump_<case>.npz (the tokens
    _select keeps) and moves them out of res."""
    arrays = res.pop("arrays")
    sel = _select({"arrays": arrays}, int(max_mib * 2**20), 0)
    out = {k: (v[sel] if isinstance(v, np.ndarray) and v.ndim and k not in
               ("norm_weight", "freqs") else v) for k, v in arrays.items()}
    out["selected"] = sel
    name = res["case"].replace("/", "_").replace("+", "p")
    path = os.path.join(out_dir, f"store_dump_{name}.npz")
    np.savez_compressed(path, **out)
    res["file"] = os.path.basename(path)
    res["file_tokens"] = int(sel.size)
    return path


def main(argv=None) -> int:
    from benchmarks import peer_compare as PC

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT") or "store_match_out")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES),
                    help="comma-separated harness case names (head_dim 512)")
    ap.add_argument("--max-mib", type=float, default=15.0, help="size bound of each .npz")
    ap.add_argument("--no-rsqrt-table", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    try:
        H = PC.load_harness(os.path.abspath(args.peer_dir))
        H.setup_import_path()
        H.prepare_toolchain({})
        import sglang

        if not getattr(sglang, "PEER_STUB", False):
            raise ImportError(f"the stub sglang package is not first on sys.path: {sglang.__file__}")
        apis = {"sglang": H.import_api(), "dsv4": PC.dsv4_api()}
    except Exception as e:  # noqa: BLE001
        log(f"[store_match] cannot load the peer kit / the engines: {type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    if not torch.cuda.is_available():
        log("[store_match] needs a CUDA GPU")
        return 1
    dev = torch.device("cuda")
    cases = {c[0]: c for c in H.build_case_list(
        SimpleNamespace(state_dtypes="fp32,bf16", quick=False, only=None, all_combos=True), torch)}
    results, status = [], 0
    for name in [c for c in args.cases.split(",") if c]:
        t0 = time.time()
        try:
            _, combo, reqs, sd, mode = cases[name]
            res = match_case(H, apis, name, combo, reqs, sd, mode, dev, keep_rows=True)
            save_case(res, args.out, args.max_mib)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            res = {"case": name, "error": f"{type(e).__name__}: {e}"}
            status = 2
        res["seconds"] = round(time.time() - t0, 1)
        results.append(res)
        log(summary_line(res))
        if not res.get("verdict", {}).get("ok", False):
            status = max(status, 2)
    if not args.no_rsqrt_table:
        try:
            tab = rsqrt_table(dev)
            np.savez_compressed(os.path.join(args.out, "rsqrt_table.npz"), **tab)
            log(f"[rsqrt table] {tab['meta_function']}: ulps from fp32(1/sqrt(double)) "
                f"{tab['meta_ulps_histogram']}; scaling-rule failures "
                f"{int(tab['meta_scaling_rule_failures'])}; torch.rsqrt differs on "
                f"{int(tab['meta_torch_rsqrt_differs'])}")
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            log(f"[rsqrt table] failed: {type(e).__name__}: {e}")
    with open(os.path.join(args.out, "store_match.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)
    log("\n".join(markdown(results)))
    log(f"wrote {args.out} (exit {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())
