// Planner math (docs/contract.md 2.1, 3.1-3.3, 3.5), shared by the CPU planner (g++) and the GPU planner
// (nvcc / hipcc) so that both write byte-identical plans by construction.
//
// Structure of a prefill plan build, identical on every backend:
//   1. per request i, from the (sanitised) lengths: the ragged offset of its first token and
//      the offsets of its first compress record and first write record, as exclusive scans of
//      extend_len and of the closed-form per-request record counts (request_counts);
//      the result is an array ReqOffsets[B + 1] whose entry B holds the totals;
//   2. per output row t (one GPU thread / one CPU loop iteration, no atomics):
//      token t of the ragged batch emits its compress / write records at indices that are
//      known in closed form (compresses_before / writes_before), then row t of each plan is
//      overwritten with the invalid record iff t is past that plan's valid count.
// Every output row is therefore written exactly once and the order of the records is the
// contract order (batch-major, position-ascending) whatever the scheduling.
//
// No torch includes; every function here is usable from host and device code.
#pragma once

#include "plan_records.h"

namespace dsv4 {

constexpr int64_t kMaxInt32 = 2147483647;

// A runtime divisor d >= 1 with the constants of an exact division by multiply and shift:
// for 0 <= a < 2^31 and d < 2^31, a / d = (a * m) >> k with s = ceil(log2 d), k = 31 + s,
// m = ceil(2^k / d) < 2^32 (the error m * d - 2^k < d <= 2^s = 2^(k - 31) keeps every
// quotient exact). The ring and SWA page sizes divide positions and slots in every planner
// record; a GPU division by a runtime value is a long dependent chain (reciprocal, multiplies,
// two corrections), this is one wide multiply. m == 0: left to the plain division (d < 1 or
// d >= 2^31 - 1; ring and page sizes are validated to [1, 2^31)).
struct Divisor {
  int64_t d;
  uint32_t m;
  int32_t k;
};

inline Divisor make_divisor(int64_t d) {
  Divisor v{d, 0u, 0};
  if (d < 1 || d > kMaxInt32 - 1) return v;
  int s = 0;
  while ((int64_t(1) << s) < d) ++s;
  v.k = 31 + s;
  v.m = uint32_t(((uint64_t(1) << v.k) + uint64_t(d) - 1) / uint64_t(d));
  return v;
}

// Everything a planner needs besides the per-request lengths: slot addressing (contract 2.1) and
// the prefill write rule (contract 3.3). Plain data, passed by value to the GPU kernels.
struct PlanParams {
  Addressing addressing;
  int32_t cr;   // compress ratio, 4 or 128
  int32_t cr_shift;  // log2(cr): slot s lies on state page s >> cr_shift, and positions
                     // count windows the same way (a shift, not a division by the runtime cr
                     // on the GPU decode planner's critical path).
  int32_t win;  // window rows: 8 (cr = 4) or 128
  Divisor ring;  // kSwaPaged / kReqRing: ring_size; kLegacy: win
  Divisor sps;   // kSwaPaged: swa_page_size (> 0); otherwise 1
  bool multipliers;  // both have one (make_divisor): slot_pair() takes div32 / mod32
  int64_t state_slot_offset;  // kOnline
  // req_to_token [rt_rows, max_ctx] int32, row stride rt_stride, unit column stride.
  const int32_t* req_to_token;
  int64_t rt_rows;
  int64_t rt_stride;
  int64_t max_ctx;
  // full_to_state [f2s_size] int64.
  const int64_t* full_to_state;
  int64_t f2s_size;
  // Prefill write rule: write iff pos >= first_w or (band) pos % sps >= sps - 4.
  int64_t pad;      // first_w = min(last_c - (cr == 4 ? 4 : 0), sl - pad)
  bool band;        // SWA-paged cr = 4: the last 4 positions of every SWA page are kept
  bool real_pages;  // legacy: pages are real even when buffer_len == 0
  bool online;      // online cr = 128 segments (contract 3.5)
};

inline void set_divisors(PlanParams& p, int64_t ring, int64_t sps) {
  p.ring = make_divisor(ring);
  p.sps = make_divisor(sps);
  p.multipliers = p.ring.m != 0 && p.sps.m != 0;
}

inline PlanParams plan_params_base(Addressing a, int32_t cr) {
  PlanParams p{};
  p.addressing = a;
  p.cr = cr;
  p.cr_shift = cr == 4 ? 2 : 7;
  p.win = window_of(cr);
  p.state_slot_offset = 0;
  p.req_to_token = nullptr;
  p.rt_rows = p.rt_stride = p.max_ctx = 0;
  p.full_to_state = nullptr;
  p.f2s_size = 0;
  p.pad = 0;
  p.band = false;
  p.real_pages = false;
  p.online = false;
  set_divisors(p, p.win, 1);
  return p;
}

// SWA-paged (use_req_ring = false, cr = 4) or request-ring (cr = 128, or use_req_ring)
// addressing. The caller has checked sps / ring (contract 2.1) and that the tables are valid.
inline PlanParams paged_plan_params(int32_t cr, bool req_ring, int64_t sps, int64_t ring,
                                    const int32_t* req_to_token, int64_t rt_rows,
                                    int64_t rt_stride, int64_t max_ctx,
                                    const int64_t* full_to_state, int64_t f2s_size) {
  PlanParams p = plan_params_base(req_ring ? Addressing::kReqRing : Addressing::kSwaPaged, cr);
  set_divisors(p, ring, req_ring ? 1 : sps);
  p.req_to_token = req_to_token;
  p.rt_rows = req_to_token != nullptr ? rt_rows : 0;
  p.rt_stride = rt_stride;
  p.max_ctx = max_ctx;
  p.full_to_state = full_to_state;
  p.f2s_size = full_to_state != nullptr ? f2s_size : 0;
  p.pad = ring > p.win ? ring - p.win + 2 : 0;
  p.band = !req_ring && cr == 4;
  return p;
}

// Legacy: a request ring of one window (8 rows for cr = 4, 128 for cr = 128), no band rule,
// no pad, pages always real.
inline PlanParams legacy_plan_params(int32_t cr) {
  PlanParams p = plan_params_base(Addressing::kLegacy, cr);
  p.real_pages = true;
  return p;
}

// Online cr = 128: one running-state slot per request.
inline PlanParams online_plan_params(int64_t state_slot_offset) {
  PlanParams p = plan_params_base(Addressing::kOnline, 128);
  p.state_slot_offset = state_slot_offset;
  p.online = true;
  return p;
}

DSV4_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
DSV4_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// a / b for b > 0. Positions, slots, rings and page sizes of real batches fit 32
// bits, where a GPU divides in a few instructions (64-bit division is a long subroutine, and
// the decode planner did several per record); anything else takes the 64-bit form.
DSV4_HD int64_t div_nn(int64_t a, int64_t b) {
  return ((uint64_t(a) | uint64_t(b)) >> 32) == 0 ? int64_t(uint32_t(a) / uint32_t(b)) : a / b;
}

// a / v.d and a % v.d for a < 2^31 and v.m != 0 (exact for a >= 0; callers discard the
// result of a negative a): a multiply and a shift, no branch.
DSV4_HD uint32_t div32(uint32_t a, const Divisor& v) {
  return uint32_t((uint64_t(a) * v.m) >> v.k);
}
DSV4_HD uint32_t mod32(uint32_t a, const Divisor& v) { return a - div32(a, v) * uint32_t(v.d); }

// a / v.d and a % v.d for a >= 0.
DSV4_HD int64_t div_by(int64_t a, const Divisor& v) {
  return (v.m != 0 && uint64_t(a) <= uint64_t(kMaxInt32)) ? int64_t(div32(uint32_t(a), v))
                                                          : div_nn(a, v.d);
}
DSV4_HD int64_t mod_by(int64_t a, const Divisor& v) { return a - div_by(a, v) * v.d; }

DSV4_HD int32_t slot32(int64_t s) { return (s < 0 || s > kMaxInt32) ? -1 : int32_t(s); }

// SWA-paged lookups in three steps: the req_to_token entry of (rid, pos) (an index into
// full_to_state, or -1 when out of range), the full_to_state entry it names (-1 when out of
// range or not live), and the state slot of that entry. Both reads are at an index clamped
// into the table (entry 0 where the lookup fails; the callers skip the lookups when a table is
// empty), so that they carry no condition: slot_pair() then has a GPU thread issue the two
// positions' reads of each table together (two memory round trips for a record, not four).
DSV4_HD int64_t full_index(const PlanParams& p, int64_t rid, int64_t pos) {
  const bool ok = pos >= 0 && pos < p.max_ctx && rid < p.rt_rows;
  const int64_t full = p.req_to_token[ok ? rid * p.rt_stride + pos : 0];
  return (!ok || full < 0 || full >= p.f2s_size) ? -1 : full;
}
DSV4_HD int64_t swa_entry(const PlanParams& p, int64_t full) {
  const int64_t swa = p.full_to_state[full < 0 ? 0 : full];
  return (full < 0 || swa < 0) ? -1 : swa;
}
DSV4_HD int32_t swa_slot(const PlanParams& p, int64_t swa) {
  return swa < 0 ? -1 : slot32(div_by(swa, p.sps) * p.ring.d + mod_by(swa, p.ring));
}
// Whether req_to_token and full_to_state both have an entry (else every lookup fails).
DSV4_HD bool swa_tables(const PlanParams& p) {
  return p.rt_rows > 0 && p.max_ctx > 0 && p.f2s_size > 0;
}

// State slot of (request row rid, position pos) (contract 2.1), or -1 when any lookup is out of
// range (never reads outside req_to_token / full_to_state) or the result does not fit int32.
DSV4_HD int32_t slot_of(const PlanParams& p, int64_t rid, int64_t pos) {
  if (rid < 0 || rid > kMaxInt32) return -1;
  switch (p.addressing) {
    case Addressing::kOnline:
      return slot32(rid + p.state_slot_offset);
    case Addressing::kSwaPaged:
      return swa_tables(p) ? swa_slot(p, swa_entry(p, full_index(p, rid, pos))) : -1;
    default:  // kReqRing, kLegacy (ring = window)
      if (pos < 0) return -1;
      return slot32(rid * p.ring.d + mod_by(pos, p.ring));
  }
}

// swa_slot() and the ring slot of slot_of() for p.multipliers, 0 <= rid, pos < 2^31 and
// -1 <= swa < 2^31: straight-line code.
DSV4_HD int32_t swa_slot32(const PlanParams& p, int64_t swa) {
  const uint32_t w = uint32_t(swa);
  const int32_t s = slot32(int64_t(div32(w, p.sps)) * p.ring.d + mod32(w, p.ring));
  return swa < 0 ? -1 : s;
}
DSV4_HD int32_t ring_slot32(const PlanParams& p, int64_t rid, int64_t pos) {
  return slot32(rid * p.ring.d + mod32(uint32_t(pos), p.ring));
}

// slot_of(p, rid, pos0) and slot_of(p, rid, pos1). When every operand fits 31 bits (real
// batches), one test picks a straight-line block that computes both (cheaper on the GPU than
// a branch around each of the four divisions).
DSV4_HD void slot_pair(const PlanParams& p, int64_t rid, int64_t pos0, int64_t pos1, int32_t& s0,
                       int32_t& s1) {
  const bool rid_ok = rid >= 0 && rid <= kMaxInt32;
  if (p.addressing == Addressing::kSwaPaged && rid_ok && swa_tables(p)) {
    const int64_t f0 = full_index(p, rid, pos0), f1 = full_index(p, rid, pos1);
    const int64_t w0 = swa_entry(p, f0), w1 = swa_entry(p, f1);
    if (p.multipliers && w0 <= kMaxInt32 && w1 <= kMaxInt32) {
      s0 = swa_slot32(p, w0);
      s1 = swa_slot32(p, w1);
    } else {
      s0 = swa_slot(p, w0);
      s1 = swa_slot(p, w1);
    }
    return;
  }
  const bool ring = p.addressing == Addressing::kReqRing || p.addressing == Addressing::kLegacy;
  if (ring && p.multipliers && rid_ok && uint64_t(pos0) <= uint64_t(kMaxInt32) &&
      uint64_t(pos1) <= uint64_t(kMaxInt32)) {
    s0 = ring_slot32(p, rid, pos0);
    s1 = ring_slot32(p, rid, pos1);
    return;
  }
  s0 = slot_of(p, rid, pos0);
  s1 = slot_of(p, rid, pos1);
}

DSV4_HD int32_t page_of(const PlanParams& p, int32_t slot) {
  return slot < 0 ? -1 : slot >> p.cr_shift;
}

// ---- decode (contract 3.2, 3.5) -----------------------------------------------------------------

// A seq_len outside [1, 2^31) has no new token: {0, -1, -1, -1}. Such an entry still looks up
// position 0 (at in-range indices), so that no branch stands between the loads of the lengths
// and those of the tables.
DSV4_HD DecodePlan decode_record(const PlanParams& p, int64_t rid, int64_t seq_len) {
  const bool live = seq_len >= 1 && seq_len <= kMaxInt32;
  const int64_t p1 = live ? seq_len - 1 : 0;
  DecodePlan r;
  if (p.online) {
    const int32_t slot = slot_of(p, rid, p1);
    r = DecodePlan{uint32_t(seq_len), slot, slot, -1};
  } else {
    int32_t s0, write_loc;
    slot_pair(p, rid, max64(p1 - p.cr, 0), p1, s0, write_loc);
    r = DecodePlan{uint32_t(seq_len), write_loc, page_of(p, s0), page_of(p, write_loc)};
  }
  return live ? r : DecodePlan{0u, -1, -1, -1};
}

// ---- prefill: per-request closed forms (contract 3.3, 3.5) --------------------------------------

// Lengths a planner works with: 0 <= sl < 2^31 and 0 <= el <= sl (device lengths are clamped
// to this; host lengths are validated to satisfy it).
DSV4_HD void sanitize_lengths(int64_t& sl, int64_t& el) {
  sl = sl < 0 ? 0 : (sl > kMaxInt32 ? kMaxInt32 : sl);
  el = el < 0 ? 0 : (el > sl ? sl : el);
}

// Compress events (online: chunk-closing segments) at positions in [prefix, pos), pos >= prefix.
DSV4_HD int64_t compresses_before(const PlanParams& p, int64_t prefix, int64_t pos) {
  return (pos >> p.cr_shift) - (prefix >> p.cr_shift);
}

// first_w of contract 3.3 (may be negative).
DSV4_HD int64_t first_write(const PlanParams& p, int64_t sl) {
  const int64_t last_c = (sl >> p.cr_shift) << p.cr_shift;
  return min64(last_c - (p.cr == 4 ? 4 : 0), sl - p.pad);
}

// Positions q in [0, n) with q % sps >= sps - 4 (sps >= 4 whenever the band rule applies).
DSV4_HD int64_t band_upto(const PlanParams& p, int64_t n) {
  if (n <= 0) return 0;
  return div_by(n, p.sps) * 4 + max64(0, mod_by(n, p.sps) - (p.sps.d - 4));
}

DSV4_HD bool emits_write(const PlanParams& p, int64_t first_w, int64_t pos) {
  return pos >= first_w || (p.band && mod_by(pos, p.sps) >= p.sps.d - 4);
}

// Offline write events at positions in [prefix, pos), prefix <= pos <= sl.
DSV4_HD int64_t writes_before(const PlanParams& p, int64_t prefix, int64_t sl, int64_t first_w,
                              int64_t pos) {
  const int64_t c = min64(max64(first_w, prefix), sl);  // every position >= c writes
  const int64_t below = min64(pos, c);                  // [prefix, below): band rule only
  int64_t n = max64(0, pos - c);
  if (p.band && below > prefix) n += band_upto(p, below) - band_upto(p, prefix);
  return n;
}

struct RecordCounts {
  int64_t c;  // plan_c records
  int64_t w;  // plan_w records
};

DSV4_HD RecordCounts request_counts(const PlanParams& p, int64_t sl, int64_t el) {
  const int64_t prefix = sl - el;
  RecordCounts r;
  r.c = compresses_before(p, prefix, sl);
  if (p.online) {
    r.w = (el > 0 && sl % 128 != 0) ? 1 : 0;
  } else {
    r.w = writes_before(p, prefix, sl, first_write(p, sl), sl);
  }
  return r;
}

// Per-request offsets (entry B of the array: the totals, with sl = 0).
struct alignas(16) ReqOffsets {
  int32_t tok;  // ragged row of the request's first token
  int32_t c;    // index of its first plan_c record
  int32_t w;    // index of its first plan_w record
  int32_t sl;   // its (sanitised) seq_len
};
static_assert(sizeof(ReqOffsets) == 16, "ReqOffsets is 16 bytes");

// Sequential scan (host): the reference for the GPU scan kernel, which computes the same
// values. Lengths are sanitised; tokens past num_q_tokens are cut off (the ragged offsets are
// min(sum of extend_lens, num_q_tokens)), so no record index can reach num_q_tokens.
inline void build_request_offsets(const PlanParams& p, const int64_t* seq_lens,
                                  const int64_t* extend_lens, int64_t B, int64_t num_q_tokens,
                                  ReqOffsets* offs) {
  int64_t tokens = 0, c = 0, w = 0;
  for (int64_t i = 0; i < B; ++i) {
    int64_t sl = seq_lens[i], el = extend_lens[i];
    sanitize_lengths(sl, el);
    const int64_t tok = min64(tokens, num_q_tokens);
    tokens += el;
    const RecordCounts n = request_counts(p, sl, min64(tokens, num_q_tokens) - tok);
    offs[i] = ReqOffsets{int32_t(tok), int32_t(c), int32_t(w), int32_t(sl)};
    c += n.c;
    w += n.w;
  }
  offs[B] = ReqOffsets{int32_t(min64(tokens, num_q_tokens)), int32_t(c), int32_t(w), 0};
}

// The request holding ragged token t, for 0 <= t < offs[B].tok: the last i with offs[i].tok <= t
// (requests with no tokens share their offset with the next one and are skipped).
DSV4_HD int32_t find_request(const ReqOffsets* offs, int32_t B, int64_t t) {
  int32_t lo = 0, hi = B;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (offs[mid].tok <= t) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

// ---- prefill: per-token records ----------------------------------------------------------------

// Offline compress record of the token at pos (j-th of its extend, ragged row `ragged`) of
// batch entry b (contract 3.1, 3.3).
DSV4_HD CompressPlan offline_compress_record(const PlanParams& p, int64_t b, int64_t rid,
                                             int64_t pos, int64_t j, int64_t ragged) {
  const int64_t buffer_len = p.win - min64(j + 1, p.win);
  CompressPlan r;
  r.seq_len = uint32_t(pos + 1);
  r.ragged_id = uint16_t(ragged);
  r.buffer_len = uint16_t(buffer_len);
  if (buffer_len == 0 && !p.real_pages) {
    r.read_page_0 = -1;
    r.read_page_1 = int32_t(b);
  } else {
    int32_t s0, s1;
    slot_pair(p, rid, max64(pos - p.cr, 0), pos, s0, s1);
    r.read_page_0 = page_of(p, s0);
    r.read_page_1 = page_of(p, s1);
  }
  return r;
}

// Online segment record: segment [a, e) of request row rid, closing token at ragged row
// `ragged` (contract 3.5).
DSV4_HD CompressPlan online_segment_record(const PlanParams& p, int64_t rid, int64_t a,
                                           int64_t e, int64_t ragged) {
  CompressPlan r;
  r.seq_len = uint32_t(e);
  r.ragged_id = uint16_t(ragged);
  r.buffer_len = uint16_t(e - a);
  r.read_page_0 = slot_of(p, rid, e - 1);
  r.read_page_1 = (rid < 0 || rid > kMaxInt32) ? -1 : int32_t(rid);
  return r;
}

// Row t of a prefill plan: emits the records of ragged token t (if t is a token) and, when t is
// past a plan's valid count, writes row t of that plan as invalid. plan_c is CompressPlan
// [num_q_tokens]; plan_w is WritePlan [num_q_tokens] (online: CompressPlan).
DSV4_HD void plan_prefill_row(const PlanParams& p, const int64_t* req_pool_indices,
                              const ReqOffsets* offs, int32_t B, int64_t t, uint8_t* plan_c,
                              uint8_t* plan_w) {
  CompressPlan* pc = reinterpret_cast<CompressPlan*>(plan_c);
  const ReqOffsets total = offs[B];
  if (t < total.tok) {
    const int32_t i = find_request(offs, B, t);
    const ReqOffsets r = offs[i];
    const int64_t el = int64_t(offs[i + 1].tok) - r.tok;
    const int64_t sl = r.sl;
    const int64_t prefix = sl - el;
    const int64_t j = t - r.tok;
    const int64_t pos = prefix + j;
    const int64_t rid = req_pool_indices[i];
    if (((pos + 1) & (p.cr - 1)) == 0) {
      const int64_t k = r.c + compresses_before(p, prefix, pos);
      if (k >= 0 && k < total.c) {
        pc[k] = p.online ? online_segment_record(p, rid, max64(prefix, pos + 1 - 128), pos + 1, t)
                         : offline_compress_record(p, i, rid, pos, j, t);
      }
    }
    if (p.online) {
      if (pos == sl - 1 && sl % 128 != 0) {
        const int64_t k = r.w;
        if (k >= 0 && k < total.w) {
          reinterpret_cast<CompressPlan*>(plan_w)[k] =
              online_segment_record(p, rid, max64(prefix, (sl / 128) * 128), sl, t);
        }
      }
    } else {
      const int64_t first_w = first_write(p, sl);
      if (emits_write(p, first_w, pos)) {
        const int64_t k = r.w + writes_before(p, prefix, sl, first_w, pos);
        if (k >= 0 && k < total.w) {
          reinterpret_cast<WritePlan*>(plan_w)[k] = WritePlan{uint32_t(t), slot_of(p, rid, pos)};
        }
      }
    }
  }
  if (t >= total.c) pc[t] = invalid_compress_plan();
  if (t >= total.w) {
    if (p.online) reinterpret_cast<CompressPlan*>(plan_w)[t] = invalid_compress_plan();
    else reinterpret_cast<WritePlan*>(plan_w)[t] = invalid_write_plan();
  }
}

}  // namespace dsv4
