"""The RMS sum of squares of the 512-dim V4.0 stores (fp8_ds_mla, bf16) in the reference engine's
order (docs/contract.md 4 and 6, docs/design/store_reference_match.md), against the numpy model
of benchmarks/store_reference_model.py: fp32 operations one IEEE operation at a time, fused
multiply-adds exact in float64, written from the reference's machine code, independent of the
C++ header. test_store.py checks the same stores against the float64 oracle within the
contract's tolerance; here the bytes must equal the model's `block` order exactly, on tokens
like the peer harness's and on constructed tokens whose bytes the order decides (a UE8M0 byte one
step apart, a rotated value 16 bf16 ulps apart in the lane-layout order).
"""
import numpy as np
import pytest

from benchmarks import store_reference_model as M

EPS = 1e-6
BLOCK = ("block", "div_sqrt")  # dsv4_ops: the reference's order, 1.0f / sqrtf
LANE = ("lane", "div_sqrt")    # the lane-layout order of the 128-dim stores and V4.1 layouts


def model_rows(x, w, f, arith, store_format):
    y = M.norm_rope32(x, w, f, M.inv_rms(x, EPS, *arith))
    if store_format == "bf16":
        return {"data": (M.bits(M.bf16_round32(y)) >> 16).astype(np.uint16).view(np.uint8)
                .reshape(x.shape[0], -1)}
    return M.encode_rows(y)


def assert_rows_equal(got, want, what):
    for k in want:
        g, e = got[k], want[k]
        bad = np.argwhere(g != e)
        assert bad.size == 0, f"{what}.{k}: {len(bad)} bytes differ, first at {bad[:3].tolist()}"


@pytest.fixture(scope="module")
def harness_tokens():
    x, w, pos, f, freqs = M.harness_like_tokens(512, seed=5)
    return x, w, pos, f, freqs


@pytest.mark.parametrize("store_format", ["fp8_ds_mla", "bf16"])
def test_harness_like_tokens_equal_block_order_model(device, harness_tokens, store_format):
    x, w, pos, f, freqs = harness_tokens
    got = M.op_rows(x, w, pos, freqs, EPS, device=device, store_format=store_format)
    assert_rows_equal(got, model_rows(x, w, f, BLOCK, store_format), store_format)


def test_the_orders_differ_on_harness_like_tokens(harness_tokens):
    """The two orders are different sums: the test above can tell them apart."""
    x = harness_tokens[0]
    s_block, s_lane = M.sumsq_block(x), M.sumsq_lane(x)
    assert 0.1 < float(np.mean(s_block != s_lane)) < 0.9
    s64 = (x.astype(np.float64) ** 2).sum(-1)
    for s in (s_block, s_lane):  # both within two fp32 ulps of the exact sum
        assert np.all(np.abs(s - s64) <= 2 * M.ulp32(s))


def op_rows_at_position_0(x, w, f, device, store_format="fp8_ds_mla"):
    return M.op_rows(x, w, np.zeros(x.shape[0], dtype=np.int64), f, EPS, device=device,
                     store_format=store_format)


def test_constructed_scale_flip(device):
    """A group whose largest value sits on the bf16 midpoint above 1.75 * 2^k: the scale byte
    is the block order's, one step from the lane order's, and the group's codes follow it."""
    x, w, f = M.constructed_scale_flip(LANE, BLOCK, EPS)
    block, lane = model_rows(x, w, f, BLOCK, "fp8_ds_mla"), model_rows(x, w, f, LANE, "fp8_ds_mla")
    assert abs(int(block["scales"][0, 0]) - int(lane["scales"][0, 0])) == 1
    got = op_rows_at_position_0(x, w, f, device)
    assert_rows_equal(got, block, "fp8_ds_mla")
    codes_moved = int((block["data"][0, :64] != lane["data"][0, :64]).sum())
    assert codes_moved > 32


def test_constructed_rope_cancellation(device):
    """A rotation that cancels (re * c - im with c ~ im / re): the rotated value is the block
    order's, 16 or more bf16 ulps from the lane order's."""
    x, w, f = M.constructed_rope_cancel(LANE, BLOCK, EPS, min_ulps=16)
    block, lane = model_rows(x, w, f, BLOCK, "fp8_ds_mla"), model_rows(x, w, f, LANE, "fp8_ds_mla")
    rope = M.decode(block["data"], block["scales"])["rope"][0, 0]
    rope_lane = M.decode(lane["data"], lane["scales"])["rope"][0, 0]
    assert abs(int(M._ordinal(rope, 0x8000)) - int(M._ordinal(rope_lane, 0x8000))) >= 16
    got = op_rows_at_position_0(x, w, f, device)
    assert_rows_equal(got, block, "fp8_ds_mla")


def test_model_fma_is_exact():
    """fma32 rounds a*b+c once, also where the double sum a*b+c lands on a float32 midpoint."""
    e = 2.0 ** -23
    a = np.array([2 * e ** 2, e / 2, 2.0 ** -12 * (1 + e)], dtype=np.float32)
    b = np.array([0.5, 1 + e, 2.0 ** -12 * (1 - e)], dtype=np.float32)
    c = np.array([1.0, 1.0, 1 + e], dtype=np.float32)
    # an exact tie (to even); just above the midpoint; just below it by 2^-70, which the
    # double sum loses (rounded twice: 1 + 2^-22)
    want = np.array([1.0, 1 + e, 1 + e], dtype=np.float32)
    assert np.array_equal(M.fma32(a, b, c), want)
