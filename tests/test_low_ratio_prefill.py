"""dsv4::c2_prefill_norm_rope_store (extend, contract V4.1 2.6) against the whole-sequence
oracle: pass 1 pairs in-batch or from the ring, pass 2 parks the last min(len, ring) rows of
each request strictly after every read; padded rows (also aliasing a live request, also inside
a request's range) and rows outside every range write nothing."""
import pytest
import torch

import dsv4_ops

import low_ratio_cases as lr
from low_ratio_cases import PairWorld


@pytest.mark.parametrize("ring", [2, 4, 8])
def test_mixed_extend(device, ring):
    """An odd-start request (partner from the ring), one from 0, a one-row even request, one
    longer than the ring, a zero-length one, padded tail rows aliasing a live request."""
    world = PairWorld(device, {2: 20, 0: 12, 4: 14, 1: 40, 3: 4}, ring=ring, seed=ring)
    world.park(2, 6)
    world.park(1, 2)
    world.prefill([(2, 7, 6), (0, 0, 9), (4, 10, 1), (1, 3, 2 * ring + 3), (3, 0, 0)],
                  pad_tail=3, alias=2)
    # the next chunk of each request continues from what pass 2 parked
    world.prefill([(2, 13, 3), (0, 9, 2), (4, 11, 1), (1, 3 + 2 * ring + 3, 5)], pad_tail=1,
                  alias=0)


def test_odd_first_and_even_last_share_a_slot(device):
    """Ring 2: the chunk's first (odd) row reads slot(pos - 1), its last (even) row parks the
    same slot: every read comes before any write."""
    world = PairWorld(device, {0: 12, 1: 12}, ring=2, seed=3)
    world.park(0, 2)
    world.park(1, 4)
    world.prefill([(0, 3, 4), (1, 5, 2)])


def test_padded_rows_inside_a_range(device):
    """A padded row among a request's last `ring` rows is not parked and no earlier row is
    reached for; a padded even row in the middle leaves its odd successor to the ring."""
    world = PairWorld(device, {0: 16, 1: 16}, ring=2, seed=4)
    world.park(0, 4)                         # the ring row the odd row after the pad reads
    # request 0: rows 0..7 = positions 0..7, row 4 (pos 4) padded, row 7 (pos 7) padded
    world.prefill([(0, 0, 8), (1, 0, 5)], padded=[4, 7], alias=1)
    # pass 2 parked pos 6 only (pos 7 padded): slot(0, 6) holds row 6, slot(0, 7) untouched
    assert lr.as_bytes(world.state[world.slot(0, 6)]).equal(lr.as_bytes(world.seq[0][6]))


def test_rows_outside_every_range_write_nothing(device):
    """Live-looking rows (odd and even, raw_out_loc != 0) after the last request's range."""
    world = PairWorld(device, {0: 10, 1: 10}, ring=4, seed=5)
    world.park(1, 4)
    world.prefill([(0, 0, 4)], pad_tail=1, stray=[(1, 5), (1, 6), (0, 4), (0, 5)])


def test_padded_rows_aliasing_a_live_request(device):
    """Padded rows (raw 0, position 0, the rid of a request of the batch) between and after
    the requests: nothing parked at slot(rid, 0), no latent, no cache."""
    world = PairWorld(device, {0: 10, 1: 10}, ring=4, seed=6)
    world.prefill([(0, 0, 3), (1, 0, 4)], pad_tail=4, alias=0)
    world.prefill([(0, 3, 3), (1, 4, 1)], pad_tail=2, alias=1)


@pytest.mark.parametrize("dtypes", [(lr.I32, lr.I32, lr.I32), (lr.I64, lr.I32, lr.I64)],
                         ids=["i32", "req_i32"])
def test_index_dtypes(device, dtypes):
    world = PairWorld(device, {0: 10, 1: 10}, ring=4, seed=7)
    world.park(1, 2)
    world.prefill([(0, 0, 7), (1, 3, 6)], pad_tail=1, dtypes=dtypes)


def test_python_layer(device):
    """dsv4_ops.c2_prefill_norm_rope_store: sglang's signature (extend_start_loc,
    extend_seq_lens after k_cache), complex freqs_cis, out=None allocates the latent."""
    world = PairWorld(device, {0: 10, 1: 10}, ring=4, seed=8)
    world.park(1, 2)
    requests = [(0, 0, 5), (1, 3, 4)]
    rows = [(rid, p) for rid, first, n in requests for p in range(first, first + n)]
    x, pos, req, raw = world.inputs(rows, alias=0)
    starts = torch.tensor([0, 5], dtype=torch.int32, device=device)
    lens = torch.tensor([5, 4], dtype=torch.int32, device=device)
    other = world.clone()
    lat = lr.random_bytes((len(rows), lr.HD), world.g, torch.bfloat16).to(device)
    lr.OPS.c2_prefill_norm_rope_store(x.to(device), other.state, other.d_w, lr.EPS,
                                      other.d_freqs, pos.to(device), req.to(device),
                                      raw.to(device), starts, lens, other.cache, other.ps,
                                      other.ring, other.layout.value, lat)
    cplx = torch.view_as_complex(world.freqs.view(-1, 32, 2).contiguous()).to(device)
    latent = dsv4_ops.c2_prefill_norm_rope_store(
        x.to(device), world.state, world.d_w, pos.to(device), req.to(device), raw.to(device),
        lr.EPS, cplx, world.cache, starts, lens, page_size=world.ps, ring_size=world.ring,
        layout=world.layout)
    assert latent.shape == (len(rows), lr.HD) and latent.dtype == torch.bfloat16
    odd = pos % 2 == 1
    lr.assert_same_bits(latent.cpu()[odd], lat.cpu()[odd], "latent of the odd rows")
    lr.assert_same_bits(world.state, other.state, "ring")
    lr.assert_same_bits(world.cache, other.cache, "cache")
