"""Property-based chains of c2 prefill (extend), decode and verify steps with random acceptance
for a few requests, every step checked against the whole-sequence oracle (contract V4.1 2.4 -
2.7, 6.3): latents per the conformance rule, the cache exact given the kernel's latents, the
ring bitwise, nothing else written."""
import pytest

import dsv4_ops

import low_ratio_cases as lr
from low_ratio_cases import PAD, PairWorld

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

LENGTH = 48


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_chain(device, data):
    draw = data.draw
    d = draw(st.sampled_from([1, 2, 3, 5]), "draft_len")
    ring = dsv4_ops.pair_ring_size(d) if d > 1 else draw(st.sampled_from([2, 4]), "ring")
    layout = draw(st.sampled_from(lr.LAYOUTS), "layout")
    ps = draw(st.sampled_from([2, 64]), "page_size")
    rids = draw(st.permutations(range(5)), "rids")[:draw(st.integers(1, 3), "requests")]
    world = PairWorld(device, {rid: LENGTH for rid in rids}, ring=ring, layout=layout,
                      page_size=ps, seed=draw(st.integers(0, 2 ** 16), "seed"))
    heads = {rid: 0 for rid in rids}
    for _ in range(draw(st.integers(2, 8), "steps")):
        op = draw(st.sampled_from(["prefill", "decode", "verify"]), "op")
        room = {rid: LENGTH - heads[rid] for rid in rids}
        alias = draw(st.sampled_from(rids), "alias")
        if op == "prefill":
            reqs = [(rid, heads[rid], min(draw(st.integers(0, 9), "extend"), room[rid]))
                    for rid in rids]
            world.prefill(reqs, pad_tail=draw(st.integers(0, 2), "pads"), alias=alias)
            for rid, _, n in reqs:
                heads[rid] += n
        elif op == "decode" or d == 1:
            live = [rid for rid in rids if room[rid] >= 1]
            rows = [(rid, heads[rid]) for rid in live] + [PAD] * draw(st.integers(0, 1), "pads")
            if rows:
                world.decode(rows, alias=alias)
            for rid in live:
                heads[rid] += 1
        else:
            live = [rid for rid in rids if room[rid] >= d]
            rows = [(rid, heads[rid] + j) for rid in live for j in range(d)]
            rows += [PAD] * (d * draw(st.integers(0, 1), "padded_blocks"))
            if rows:
                world.decode(rows, draft_len=d, alias=alias)
            for rid in live:
                heads[rid] += draw(st.integers(1, d), "accepted")
                world.redraft(rid, heads[rid])
