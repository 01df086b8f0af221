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

#include <type_traits>

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
};

// Rows a row slot of pass 1 handles: 2, the pairs (2p, 2p + 1), so that no slot sits out on an
// even row; 1 (a build knob for A/B runs): a slot a row. A compile-time constant: the kernel
// of one row a slot has no second row's code.
#ifndef DSV4_LR_POOL_SLOT_ROWS
#define DSV4_LR_POOL_SLOT_ROWS 2
#endif

namespace low_ratio {

constexpr int kPoolSlotRows = DSV4_LR_POOL_SLOT_ROWS;
static_assert(kPoolSlotRows == 1 || kPoolSlotRows == 2, "DSV4_LR_POOL_SLOT_ROWS is 1 or 2");

// Whether pass 1 loads its slot's rows before their indices are back (1) or once it knows which
// row closes (0, faster: 60 registers cost a block an SM, docs/design/low_ratio.md); same bytes.
#ifndef DSV4_LR_POOL_EARLY_ROWS
#define DSV4_LR_POOL_EARLY_ROWS 0
#endif
constexpr bool kPoolEarlyRows = DSV4_LR_POOL_EARLY_ROWS != 0;

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
  bool partner_r0 = false;  // the partner is the slot's first row (r1 in the batch with r0)
};

// The rows r0, r1 of row slot th.row (kPoolSlotRows of them; r1 past them or past the input
// rows does not close) with their partners: an odd row with raw_out_loc != 0 inside a request's
// range pools with row t - 1 (r0 for r1) when that row is in the same range, has the same rid,
// position pos - 1 and raw_out_loc != 0, else with the ring row (none: the row does not close).
// Two named rows, no array: a row picked at run time from an array put it in local memory.
DSV4_DEVICE void pool_rows(const C2PrefillKernelArgs& a, const RowThread& th, PoolRow* r0,
                           PoolRow* r1) {
  const PairInputs& in = a.in;
  *r0 = PoolRow{};
  *r1 = PoolRow{};
  r0->t = th.row * kPoolSlotRows;
  r1->t = r0->t + 1;
  const bool live0 = r0->t < in.n_rows, live1 = kPoolSlotRows == 2 && r1->t < in.n_rows;
  if (live0) {
    r0->raw = in.raw(r0->t);
    r0->pos = in.pos(r0->t);
    r0->rid = in.rid(r0->t);
  }
  if (live1) {
    r1->raw = in.raw(r1->t);
    r1->pos = in.pos(r1->t);
    r1->rid = in.rid(r1->t);
  }
  // Padded and even rows write nothing in pass 1; neither do rows outside every request's
  // range.
  const bool wanted0 = live0 && r0->raw != 0 && r0->pos % 2 != 0;
  const bool wanted1 = live1 && r1->raw != 0 && r1->pos % 2 != 0;
  int64_t first0, first1;
  request_starts_of(a.extend_start, a.extend_lens, a.num_reqs, r0->t, wanted0, r1->t, wanted1,
                    th.lane, &first0, &first1);
  if (wanted0 && first0 >= 0) {
    const int64_t p = r0->t - 1;
    const bool in_batch =
        p >= first0 && in.rid(p) == r0->rid && in.pos(p) == r0->pos - 1 && in.raw(p) != 0;
    r0->partner = in_batch ? in.row(p) : in.ring_row(r0->rid, r0->pos - 1);
    r0->vec_partner = in_batch ? in.vec_in : in.vec_state;
  }
  if (wanted1 && first1 >= 0) {
    const bool in_batch = r0->t >= first1 && r0->rid == r1->rid && r0->pos == r1->pos - 1 &&
                          r0->raw != 0;
    r1->partner = in_batch ? in.row(r0->t) : in.ring_row(r1->rid, r1->pos - 1);
    r1->vec_partner = in_batch ? in.vec_in : in.vec_state;
    r1->partner_r0 = in_batch;
  }
}

// r0 when `first`, else r1, field by field (selects, no address taken).
DSV4_DEVICE PoolRow pick_row(bool first, const PoolRow& r0, const PoolRow& r1) {
  PoolRow r;
  r.t = first ? r0.t : r1.t;
  r.pos = first ? r0.pos : r1.pos;
  r.rid = first ? r0.rid : r1.rid;
  r.raw = first ? r0.raw : r1.raw;
  r.partner = first ? r0.partner : r1.partner;
  r.vec_partner = first ? r0.vec_partner : r1.vec_partner;
  r.partner_r0 = first ? r0.partner_r0 : r1.partner_r0;
  return r;
}

}  // namespace low_ratio

// A row slot (the row_threads of one row in the block) handles kPoolSlotRows consecutive rows
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
  // kPoolEarlyRows: the slot's rows t0, t0 + 1 go out with their indices (each is the row that
  // closes, or t0 the partner of t0 + 1 in a request's batch); rows past the input stay zero.
  const int64_t t0 = th.row * kPoolSlotRows;
  PairPart<kChunks> early0 = {}, early1 = {};
  if constexpr (kPoolEarlyRows) {
    if (t0 < in.n_rows) load_pair_part(in.row(t0), th, in.vec_in, early0);
    if (kPoolSlotRows == 2 && t0 + 1 < in.n_rows)
      load_pair_part(in.row(t0 + 1), th, in.vec_in, early1);
  }
  // Publishes row r (or passes zeros through the barrier when `closes` is false); `early`
  // (a compile-time flag): its values and a batch partner from early0 / early1, r being r0
  // when `is_r0`; else loaded here.
  const auto round = [&](const PoolRow& r, bool closes, bool is_r0, auto early) {
    RowThread rt = th;
    rt.row = r.t;
    LatentInputs<kChunks> li;
    if (closes) {
      PairPart<kChunks> own, partner;
      if constexpr (decltype(early)::value) {
        select_pair_part(is_r0, early0, early1, own);
        if (r.partner_r0) partner = early0;
        else load_pair_part(r.partner, rt, r.vec_partner, partner);
      } else {
        load_pair_part(in.row(r.t), rt, in.vec_in, own);
        load_pair_part(r.partner, rt, r.vec_partner, partner);
      }
      pooled_inputs(a.out, rt, own, partner, r.pos, li);
    }
    publish_latent<kEncoding>(a.out, rt, closes, li, r.raw >> 1);  // every thread (a barrier)
  };
  PoolRow r0, r1;
  pool_rows(a, th, &r0, &r1);
  const bool closes0 = r0.partner != nullptr, closes1 = r1.partner != nullptr;
  round(pick_row(closes0, r0, r1), closes0 || closes1, closes0,
        std::integral_constant<bool, kPoolEarlyRows>{});
  if constexpr (kPoolSlotRows == 2) {
    // A second round where a slot of the block (of the lane group: one group a row) has two
    // rows; their values found again, which keeps them out of the first round's registers.
    const bool both = closes0 && closes1;
    if (kChunks == kRowChunks ? both : __syncthreads_or(both) != 0) {
      pool_rows(a, th, &r0, &r1);
      round(r1, both, false, std::false_type{});
    }
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
