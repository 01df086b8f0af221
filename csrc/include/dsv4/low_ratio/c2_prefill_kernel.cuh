// c2_prefill_norm_rope_store GPU kernels (docs/contract.md, "V4.1" 2.6), shared by CUDA and HIP:
// the ratio-2 compressor over an extend batch, in two launches on one stream.
//   c2_prefill_pool_kernel<Encoding, Chunks>: pass 1, four 32-lane groups or one per row
//     (Chunks 1 or 4, row_encode.cuh's mappings). An odd row with raw_out_loc != 0 inside a
//     request's range pools with row t-1 when that row is in the same range, has the same rid,
//     position pos-1 and raw_out_loc != 0, else with state[slot(rid, pos-1)]; it writes its
//     latent row and its cache slot raw_out_loc >> 1.
//   c2_prefill_park_kernel<Chunks>: pass 2, park_blocks blocks per request: the last
//     min(len, ring) rows of each request, padded ones skipped, copied bitwise to
//     state[slot(rid, pos)]. It starts after pass 1 has finished (stream order; with PDL its
//     pdl_wait waits for pass 1's completion), so no pass-1 read sees a pass-2 write.
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct C2PrefillKernelArgs {
  low_ratio::LatentOutputs out;  // unused by the park kernel
  low_ratio::PairInputs in;
  const int32_t* extend_start;   // [num_reqs]
  const int32_t* extend_lens;    // [num_reqs]
  int64_t num_reqs;
  int64_t park_blocks;  // park kernel blocks per request (rows per block * park_blocks >= ring)
  int64_t slot_rows;    // pool kernel rows per row slot: 1 or 2 (pairs 2p, 2p + 1)
};

namespace low_ratio {

// For rows t0 and t1 (wanted0 / wanted1: whether to look), the first row of the lowest request
// i whose range [start_i, start_i + len_i) holds the row (clipped to row 0), or -1
// (zero-length requests hold none). The lane group scans 32 requests a step, both rows at once
// (each of a row's groups scans for itself); the scan stops once every wanted row is found.
DSV4_DEVICE void request_starts_of(const int32_t* start, const int32_t* lens, int64_t num_reqs,
                                   int64_t t0, bool wanted0, int64_t t1, bool wanted1, int lane,
                                   int64_t* first0, int64_t* first1) {
  *first0 = -1;
  *first1 = -1;
  for (int64_t base = 0; base < num_reqs && (wanted0 || wanted1); base += kLaneGroup) {
    const int64_t i = base + lane;
    int64_t s = 0, e = 0;
    if (i < num_reqs) {
      s = start[i];
      const int64_t n = lens[i];
      e = n > 0 ? s + n : s;
    }
    const uint32_t m0 = group_ballot(wanted0 && s <= t0 && t0 < e);
    const uint32_t m1 = group_ballot(wanted1 && s <= t1 && t1 < e);
    if (m0 != 0u) {
      const int64_t f = shfl_idx(s, __ffs(int(m0)) - 1);
      *first0 = f > 0 ? f : 0;
      wanted0 = false;
    }
    if (m1 != 0u) {
      const int64_t f = shfl_idx(s, __ffs(int(m1)) - 1);
      *first1 = f > 0 ? f : 0;
      wanted1 = false;
    }
  }
}

// A row of pass 1 and what it needs: its indices and, when it closes a pair, its partner row.
struct PoolRow {
  int64_t t = 0;
  int64_t pos = 0;
  int64_t rid = 0;
  int64_t raw = 0;
  const float* partner = nullptr;  // non-null: the row closes (publishes a latent)
  bool vec_partner = false;
};

// The rows of row slot th.row (C2PrefillKernelArgs::slot_rows of them; row[1].t past them or
// past the input rows gives a row that does not close) with their partners: an odd row with
// raw_out_loc != 0 inside a request's range pools with row t - 1 (row 0 of the slot for row 1)
// when that row is in the same range, has the same rid, position pos - 1 and raw_out_loc != 0,
// else with the ring row (none: the row does not close).
DSV4_DEVICE void pool_rows(const C2PrefillKernelArgs& a, const RowThread& th, PoolRow (&row)[2]) {
  const PairInputs& in = a.in;
  row[0] = PoolRow{};
  row[1] = PoolRow{};
  row[0].t = th.row * a.slot_rows;
  row[1].t = row[0].t + 1;
  const bool live[2] = {row[0].t < in.n_rows, a.slot_rows == 2 && row[1].t < in.n_rows};
  bool wanted[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (live[k]) {
      row[k].raw = in.raw(row[k].t);
      row[k].pos = in.pos(row[k].t);
      row[k].rid = in.rid(row[k].t);
    }
    // Padded and even rows write nothing in pass 1; neither do rows outside every request's
    // range.
    wanted[k] = live[k] && row[k].raw != 0 && row[k].pos % 2 != 0;
  }
  int64_t first[2];
  request_starts_of(a.extend_start, a.extend_lens, a.num_reqs, row[0].t, wanted[0], row[1].t,
                    wanted[1], th.lane, &first[0], &first[1]);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    PoolRow& r = row[k];
    if (!wanted[k] || first[k] < 0) continue;
    bool in_batch = false;
    if (r.t - 1 >= first[k]) {
      if (k == 1) {
        in_batch = row[0].rid == r.rid && row[0].pos == r.pos - 1 && row[0].raw != 0;
      } else {
        const int64_t p = r.t - 1;
        in_batch = in.rid(p) == r.rid && in.pos(p) == r.pos - 1 && in.raw(p) != 0;
      }
    }
    r.partner = in_batch ? in.row(r.t - 1) : in.ring_row(r.rid, r.pos - 1);
    r.vec_partner = in_batch ? in.vec_in : in.vec_state;
  }
}

}  // namespace low_ratio

// A row slot (the row_threads of one row in the block) handles `slot_rows` consecutive rows
// (1, or 2: rows 2p and 2p + 1 of slot p): an even row writes nothing in pass 1, so a slot of
// one row leaves its threads idle on every other row. Of its rows those that close are
// published one per round: one round, or two when both close (the odd last row of a request
// and the odd first row of the next); a round in which the slot has none passes zeros through
// row_sumsq's barrier.
template <int kEncoding, int kChunks>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_prefill_pool_kernel(C2PrefillKernelArgs a) {
  using namespace low_ratio;
  const PairInputs& in = a.in;
  const RowThread th = row_thread<kChunks>();
  pdl_wait();
  pdl_trigger();
  // Publishes row r (or passes zeros through the barrier when `closes` is false).
  const auto round = [&](const PoolRow& r, bool closes) {
    RowThread rt = th;
    rt.row = r.t;
    LatentInputs<kChunks> li;
    if (closes) {
      PairPart<kChunks> own;
      load_pair_part(in.row(r.t), rt, in.vec_in, own);
      load_pooled_inputs(a.out, rt, own, r.partner, r.vec_partner, r.pos, li);
    }
    publish_latent<kEncoding>(a.out, rt, closes, li, r.raw >> 1);  // every thread (a barrier)
  };
  PoolRow row[2];
  pool_rows(a, th, row);
  const bool closes0 = row[0].partner != nullptr, closes1 = row[1].partner != nullptr;
  round(closes0 ? row[0] : row[1], closes0 || closes1);
  // A second round where a slot of the block (of the lane group: one group a row) has two rows;
  // their values found again, which keeps them out of the first round's registers.
  const bool both = closes0 && closes1;
  if (kChunks == kRowChunks ? both : __syncthreads_or(both) != 0) {
    pool_rows(a, th, row);
    round(row[1], both);
  }
}

// Block b: request b / park_blocks; its row slot r of the request's rows (counting the
// request's blocks): the r-th of the last min(len, ring) rows of its range clipped to the
// input rows.
template <int kChunks>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_prefill_park_kernel(C2PrefillKernelArgs a) {
  using namespace low_ratio;
  const PairInputs& in = a.in;
  const RowThread th = row_thread<kChunks>();
  const int64_t i = int64_t(blockIdx.x) / a.park_blocks;
  const int64_t r = (int64_t(blockIdx.x) % a.park_blocks) * (blockDim.x / row_threads(kChunks)) +
                    th.slot;
  pdl_wait();
  pdl_trigger();
  const int64_t s = a.extend_start[i], len = a.extend_lens[i];
  const int64_t begin = s < 0 ? 0 : s > in.n_rows ? in.n_rows : s;
  const int64_t e = len > 0 ? s + len : s;
  const int64_t end = e < begin ? begin : e > in.n_rows ? in.n_rows : e;
  const int64_t kept = end - begin < in.ring ? end - begin : in.ring;
  if (r >= kept) return;
  const int64_t t = end - kept + r;
  if (in.raw(t) == 0) return;  // padded: skipped, not replaced
  PairPart<kChunks> row;
  load_pair_part(in.row(t), th, in.vec_in, row);
  in.park(in.rid(t), in.pos(t), th, row);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
