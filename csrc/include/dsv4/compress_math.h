// compress_forward math shared by the CPU kernel and the GPU kernels (docs/contract.md 1.2, 3.1, 3.4, 3.5).
//
// Torch-free. Everything that decides WHAT is computed lives here: which state slot or input
// row feeds window row r, which rows are absent, the chunked safe-softmax fold, the merge of
// partial softmax states and the online running-state conversions. Only the fp32 summation
// order differs between backends: the CPU folds cr = 128 windows as 8 groups of 16 rows in
// chunks of 4 (compress_cpu.cpp); the GPU folds 8 rows per thread and merges 16 partial
// states (and uses the hardware exponential), so the backends agree to fp32 rounding, not
// bit for bit.
//
// Decisions where the contract is silent (also in the family's report):
//  * Rows at negative positions (s - win + r < 0) are absent for both ratios (the contract states it
//    for cr = 4; for cr = 128 it only matters for malformed records with s < 128).
//  * Decode seq_len == 0 closes no window (out = 0); offline decode still copies the row.
//    Online decode with seq_len == 0 carries no token: out = 0 and no state is written.
//  * Offline decode pools "after the copy": the just-written row enters the window as its
//    state-dtype value. The cr = 4 GPU kernel stores the row first and reads it back from the
//    state (the thread that stores channels c..c+3 reads them); the cr = 128 one reads it from
//    its input row, rounded as the copy stores it. Batch entries that address each other's
//    slots race (the planners never emit them).
//  * Online prefill merges with the stored state at read_page_1 if >= 0, else read_page_0,
//    literally as contract 3.5 says (online records carry read_page_1 = rid, the committed
//    bank; read_page_0 = rid + state_slot_offset is where the trailing segment is stored).
//    The stored state goes first in the merge. A segment longer than its 128-chunk is
//    clipped to the chunk and merges nothing. Online decode reads read_page_0 and stores at
//    write_loc.
//  * A bf16 online state stores RNE(M), RNE(S), RNE(K) of the fp32 values (S stays relative
//    to the fp32 M), so each stored value is within one bf16 ulp of the exact state.
//  * Every slot / page / ragged row outside its buffer, or negative, is an absent row on
//    read and a skipped write; a window with no present row pools to 0.
//  * Non-finite values (contract 1.2 is the float64 softmax): a NaN in a score, an ape entry or a
//    kv value of a present row pools to NaN, as does a +inf logit (inf - inf); -inf logits
//    weigh 0, and a channel whose present logits are all -inf pools to 0 (softmax gives NaN
//    there). Every NaN written is the canonical one (canonical_nan), so the backends agree
//    bit for bit on it. An absent row of a window that has a present row is kv 0 with score
//    kAbsentScore, and its logit kAbsentScore + ape (the GPU folds every row slot of a thread
//    without a per-row select, and the CPU does the same): a NaN or +inf ape entry therefore
//    also poisons the windows where its row is absent (the first cr = 4 window, as the contract's
//    score -FLT_MAX + ape; the rows of a chunk outside an online segment).
#pragma once

#include <cfloat>
#include <cmath>
#include <math.h>

#include "numerics.h"
#include "plan_records.h"
#include "portability.h"

namespace dsv4 {
namespace compress {

// ---- element types --------------------------------------------------------------------------

// Runtime element codes of the small tensors whose dtype does not pick a kernel instantiation.
enum ApeType : int32_t { kApeF32 = 0, kApeBF16 = 1, kApeF16 = 2 };
enum OutType : int32_t { kOutF32 = 0, kOutBF16 = 1 };

// IEEE binary16 bits -> fp32 (exact). Only ape may be fp16. Device code uses the hardware
// conversion (also exact); the host spells it out.
DSV4_HD float f16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#elif defined(__HIP_DEVICE_COMPILE__)
  return float(__builtin_bit_cast(_Float16, h));
#else
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_f32(sign | 0x7f800000u | (m << 13));  // inf / nan
  if (e == 0) {
    float v = float(m) * 5.9604644775390625e-8f;  // m * 2^-24 (zero or subnormal)
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

DSV4_HD float load_ape(const void* ape, int32_t type, int64_t i) {
  if (type == kApeF32) return static_cast<const float*>(ape)[i];
  uint16_t h = static_cast<const uint16_t*>(ape)[i];
  return type == kApeBF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

DSV4_HD void store_out(void* out, int32_t type, int64_t i, float v) {
  if (type == kOutF32)
    static_cast<float*>(out)[i] = v;
  else
    static_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
}

// The value a state buffer of element type T holds after storing v (bf16: RNE rounding).
DSV4_HD float round_to(const float*, float v) { return v; }
DSV4_HD float round_to(const uint16_t*, float v) { return round_to_bf16(v); }

// ---- geometry ---------------------------------------------------------------------------------

// Channels per GPU thread of the cr = 4, online decode and row-copy kernels.
constexpr int kVec = 4;

// Elements of one kv_score input / offline state row.
DSV4_HD int64_t input_row_elems(int cr, int hd) {
  return cr == 4 ? 4 * int64_t(hd) : 2 * int64_t(hd);
}
// Elements of one state row: offline = raw input row, online = m | S | K.
DSV4_HD int64_t state_row_elems(int cr, int hd, bool online) {
  return online ? 3 * int64_t(hd) : input_row_elems(cr, hd);
}

// Offsets (elements) of window row r's kv and score inside a kv_score row (contract 1.1):
// cr = 4 rows 0..3 use kv_ovl (q0) / score_ovl (q2), rows 4..7 kv (q1) / score (q3);
// cr = 128 rows use kv (h0) / score (h1).
DSV4_HD int64_t kv_offset(int cr, int hd, int r) { return cr == 4 ? (r < 4 ? 0 : hd) : 0; }
DSV4_HD int64_t score_offset(int cr, int hd, int r) {
  return cr == 4 ? (r < 4 ? 2 * int64_t(hd) : 3 * int64_t(hd)) : int64_t(hd);
}

// Where the rows of one pooling window come from.
//   rows r in [lo, hi) may be present (outside: absent, weight 0);
//   r < bl: state buffer (cr = 4: r < 4 row r of page0, r >= 4 row r-4 of page1;
//           cr = 128: row r of page1); r >= bl: ragged input row in_base + r.
// Sources out of range (negative or past the buffer) are absent as well.
// All fields are 32-bit: ragged ids are 16-bit and pages come from int32 plan fields, so the
// kernels resolve a window without 64-bit arithmetic (addresses are formed in 64 bits).
struct WindowDesc {
  int32_t in_base;  // ragged row of window row 0 (negative near the start of the input)
  int32_t page0, page1;
  int32_t lo, hi, bl;
};

// A window resolved against its buffers, once per window, so that the source of each row is
// a few compares (the GPU kernels turn these into predicated loads with constant offsets):
//   rows [in_lo, in_hi): ragged input row in_base + r, every one inside the input;
//   rows [st_lo, st_hi): state, cr = 4: r < 4 row r of page0, r >= 4 row r-4 of page1;
//                        cr = 128: row r of page1; present only if that page is in the buffer.
// Every other row is absent (the two ranges never overlap).
struct WindowRows {
  int32_t in_base, page0, page1;
  int32_t in_lo, in_hi, st_lo, st_hi;
  bool page0_ok, page1_ok;
};

DSV4_HD int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
DSV4_HD int32_t min_i32(int32_t a, int32_t b) { return a < b ? a : b; }

// Pages of cr slots in a state buffer of num_state_rows flat rows, saturated to int32 (a page
// index beyond it is out of range either way).
DSV4_HD int32_t num_pages(int64_t num_state_rows, int cr) {
  const int64_t pages = num_state_rows / cr;
  return pages > 0x7fffffff ? 0x7fffffff : int32_t(pages);
}

// The state part of a window: rows [st_lo, st_hi) and the pages' range checks. No input rows
// (decode windows have none; resolve_rows adds them).
DSV4_HD WindowRows resolve_state_rows(const WindowDesc& d, int cr, int64_t num_state_rows) {
  WindowRows w;
  w.in_base = d.in_base;
  w.page0 = d.page0;
  w.page1 = d.page1;
  const int32_t pages = num_pages(num_state_rows, cr);
  w.page0_ok = d.page0 >= 0 && d.page0 < pages;
  w.page1_ok = d.page1 >= 0 && d.page1 < pages;
  w.st_lo = d.lo;
  w.st_hi = d.hi < d.bl ? d.hi : d.bl;
  w.in_lo = 0;
  w.in_hi = 0;
  return w;
}

DSV4_HD WindowRows resolve_rows(const WindowDesc& d, int cr, int64_t num_state_rows,
                                int64_t num_in_rows) {
  WindowRows w = resolve_state_rows(d, cr, num_state_rows);
  // Input rows: max(lo, bl) <= r < hi and 0 <= in_base + r < num_in_rows. lo, bl, hi lie in
  // [0, win] and in_base >= -(win - 1), so in_lo lands in [0, win]; in_hi in [in_lo, win].
  const int32_t lo = max_i32(max_i32(d.lo, d.bl), -d.in_base);
  const int64_t room = num_in_rows - d.in_base;  // rows from in_base to the input's end
  const int32_t hi = room < d.hi ? int32_t(room < 0 ? 0 : room) : d.hi;
  w.in_lo = lo;
  w.in_hi = max_i32(hi, lo);
  return w;
}

DSV4_HD bool row_from_input(const WindowRows& w, int r) { return r >= w.in_lo && r < w.in_hi; }

DSV4_HD bool row_from_state(const WindowRows& w, int cr, int r) {
  return r >= w.st_lo && r < w.st_hi && ((cr == 4 && r < 4) ? w.page0_ok : w.page1_ok);
}

// Flat state row of window row r (meaningful where row_from_state).
DSV4_HD int64_t state_row_of(const WindowRows& w, int cr, int r) {
  return cr == 4 ? int64_t(r < 4 ? w.page0 : w.page1) * 4 + (r & 3) : int64_t(w.page1) * 128 + r;
}

// True if no row of the window is present (it pools to 0).
DSV4_HD bool window_empty(const WindowRows& w, int cr) {
  const bool st =
      w.st_lo < w.st_hi &&
      (cr == 4 ? ((w.st_lo < 4 && w.page0_ok) || (w.st_hi > 4 && w.page1_ok)) : w.page1_ok);
  return w.in_lo >= w.in_hi && !st;
}

// Source of one window row: kind 0 absent, 1 state (index = flat state row), 2 input row.
struct RowSource {
  int32_t kind;
  int64_t index;
};

enum : int32_t { kAbsent = 0, kFromState = 1, kFromInput = 2 };

DSV4_HD RowSource row_source(const WindowRows& w, int cr, int r) {
  if (row_from_input(w, r)) return RowSource{kFromInput, int64_t(w.in_base) + r};
  if (row_from_state(w, cr, r)) return RowSource{kFromState, state_row_of(w, cr, r)};
  return RowSource{kAbsent, -1};
}

// Offline prefill record (contract 3.1 / 3.4). Window row r is position seq_len - win + r; rows at
// negative positions (cr = 4, seq_len == 4: rows 0..3) are absent whatever the source rule
// selects. Invalid records pool nothing (zeros).
DSV4_HD WindowDesc offline_prefill_window(const CompressPlan& p, int cr) {
  const int win = window_of(cr);
  WindowDesc d{0, -1, -1, 0, 0, 0};
  if (!is_valid(p)) return d;
  int64_t s = int64_t(p.seq_len);
  d.lo = s >= win ? 0 : int32_t(win - s);
  d.hi = win;
  d.bl = p.buffer_len < win ? int32_t(p.buffer_len) : win;
  d.in_base = int32_t(p.ragged_id) - (win - 1);
  d.page0 = p.read_page_0;
  d.page1 = p.read_page_1;
  return d;
}

// Offline decode record: the window closes iff seq_len % cr == 0 (seq_len 0 closes nothing);
// every row comes from the state buffer.
DSV4_HD bool decode_closes(const DecodePlan& p, int cr) {
  return p.seq_len != 0 && p.seq_len % uint32_t(cr) == 0;
}

DSV4_HD WindowDesc offline_decode_window(const DecodePlan& p, int cr) {
  const int win = window_of(cr);
  WindowDesc d{0, -1, -1, 0, 0, 0};
  if (!decode_closes(p, cr)) return d;
  int64_t s = int64_t(p.seq_len);
  d.lo = s >= win ? 0 : int32_t(win - s);
  d.hi = win;
  d.bl = win;
  d.page0 = p.read_page_0;
  d.page1 = p.read_page_1;
  return d;
}

// Online segment record (contract 3.5): seq_len = e (segment end), buffer_len = segment length n,
// ragged_id = ragged row of position e-1. Window row r = chunk offset r; the segment occupies
// offsets [q_end-n+1, q_end] with q_end = (e-1) % 128 and ragged rows ragged_id-q_end+r.
// A segment longer than its chunk is clipped to the chunk.
struct OnlineSegment {
  WindowDesc win;
  bool valid;       // a real record with at least the end position (e >= 1)
  bool merge;       // the segment does not start its chunk: merge with the stored state
  int64_t read_slot;   // stored state (read_page_1 if >= 0 else read_page_0)
  int64_t write_slot;  // read_page_0
};

DSV4_HD OnlineSegment online_segment(const CompressPlan& p) {
  OnlineSegment o;
  o.win = WindowDesc{0, -1, -1, 0, 0, 0};
  o.valid = is_valid(p) && p.seq_len != 0;
  o.merge = false;
  o.read_slot = p.read_page_1 >= 0 ? int64_t(p.read_page_1) : int64_t(p.read_page_0);
  o.write_slot = p.read_page_0;
  if (!o.valid) return o;
  const int64_t e = int64_t(p.seq_len);
  const int32_t q_end = int32_t((e - 1) % 128);
  const int32_t n = int32_t(p.buffer_len);
  o.win.lo = n > q_end ? 0 : q_end + 1 - n;
  o.win.hi = q_end + 1;
  o.win.bl = 0;
  o.win.in_base = int32_t(p.ragged_id) - q_end;
  o.merge = o.win.lo > 0;  // (e - n) % 128 != 0
  return o;
}

// Online decode record: q = (seq_len-1) % 128; fold into the state at read_page_0 (restart
// at q == 0); q == 127 closes the chunk. seq_len == 0 carries no token (nothing happens).
DSV4_HD bool online_decode_active(const DecodePlan& p) { return p.seq_len != 0; }
DSV4_HD int32_t online_decode_q(const DecodePlan& p) { return int32_t((p.seq_len - 1u) % 128u); }

// ---- safe softmax -----------------------------------------------------------------------------

// e^x. Device code uses the hardware approximation (CUDA: ex2.approx.ftz of x * log2(e),
// within 2 ulp plus the rounding of x * log2(e); the pooled values stay well inside the 1e-5
// relative tolerance of contract 4). Flushing results below 2^-126 to zero is harmless here: every
// exponential is a weight relative to a maximum whose own weight is 1, so a weight under
// 1e-38 cannot move an fp32 sum, and it saves the subnormal fix-up that __expf spends 3 more
// instructions on (a third of the pooling kernels' arithmetic). The CPU keeps expf.
DSV4_HD float fexp(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
#elif defined(__HIP_DEVICE_COMPILE__)
  return __expf(x);
#else
  return expf(x);
#endif
}

// Running safe-softmax state of one channel: m = max of the folded logits, s = sum e^(z-m),
// a = sum e^(z-m) kv (unnormalised). Empty: (-FLT_MAX, 0, 0).
struct SoftmaxState {
  float m, s, a;
};

DSV4_HD SoftmaxState softmax_empty() { return SoftmaxState{-FLT_MAX, 0.0f, 0.0f}; }

// Fold U rows at once (one rescale per chunk). Absent rows (present[u] false) contribute
// nothing; their z / kv values are ignored.
template <int U>
DSV4_HD void softmax_fold(SoftmaxState& st, const float (&z)[U], const float (&kv)[U],
                          const bool (&present)[U]) {
  float cm = st.m;
#pragma unroll
  for (int u = 0; u < U; ++u) cm = present[u] ? fmaxf(cm, z[u]) : cm;
  const float scale = fexp(st.m - cm);
  float s = st.s * scale, a = st.a * scale;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float e = present[u] ? fexp(z[u] - cm) : 0.0f;
    s += e;
    a += e * kv[u];
  }
  st.m = cm;
  st.s = s;
  st.a = a;
}

// State of U rows folded at once (one max, one exponential per row). Absent rows must carry
// kv = 0 and a score of at most kAbsentScore (plus ape): they get weight 0 next to any present
// row, and a set without present rows gives (m, s >= 1, 0), whose value a / s is 0 and whose
// weight in a merge with a present state is 0. Present rows at -inf weigh 0 (the max is kept
// finite, so -inf - m never becomes inf - inf), as in softmax_fold. Used by the GPU kernels,
// which fold every row slot of a thread (absent ones carry those values) instead of branching
// per row.
constexpr float kAbsentScore = -3.3895313892515355e38f;  // the most negative finite bf16

template <int U>
DSV4_HD SoftmaxState softmax_of(const float (&z)[U], const float (&kv)[U]) {
  float m = -FLT_MAX;
#pragma unroll
  for (int u = 0; u < U; ++u) m = fmaxf(m, z[u]);
  float s = 0.0f, a = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float e = fexp(z[u] - m);
    s += e;
    a = fmaf(e, kv[u], a);
  }
  return SoftmaxState{m, s, a};
}

// x <- merge(x, y) (contract 3.5 merge of two partial states, unnormalised form).
DSV4_HD void softmax_merge(SoftmaxState& x, const SoftmaxState& y) {
  const float M = fmaxf(x.m, y.m);
  const float sx = fexp(x.m - M), sy = fexp(y.m - M);
  x.s = x.s * sx + y.s * sy;
  x.a = x.a * sx + y.a * sy;
  x.m = M;
}

// v, or the canonical quiet NaN (bits 0x7fc00000, torch's NaN) if v is a NaN: the backends'
// arithmetic yields NaNs of different sign and payload (x86 propagates an operand's, CUDA has
// its own), and every NaN compress_forward writes is this one (bf16: f32_to_bf16's 0x7fc0).
DSV4_HD float canonical_nan(float v) { return v != v ? bits_f32(0x7fc00000u) : v; }

// Normalised pooled value. s == 0 only where no row weighs anything (no present row, or every
// present logit -inf): 0, never 0/0. A NaN logit (score or ape) makes s a NaN, a NaN kv makes
// a one (also at weight 0, 0 * NaN, as the float64 softmax has it), and a +inf logit makes
// both NaN (inf - inf): the value is then the canonical NaN.
DSV4_HD float softmax_value(const SoftmaxState& st) {
  return canonical_nan(st.s != 0.0f ? st.a / st.s : 0.0f);
}

// Online running state (m | S | K, K normalised) -> softmax state. An empty state stored in
// bf16 reads back m = -inf (-FLT_MAX rounds up); clamping keeps merges free of inf - inf.
DSV4_HD SoftmaxState from_online(float m, float S, float K) {
  return SoftmaxState{fmaxf(m, -FLT_MAX), S, K * S};
}

// Softmax state -> the (m, S, K) an online state row stores. m is never a NaN (fmaxf skips a
// NaN logit); a NaN reaches S and K, and stays there through every later fold and merge.
struct OnlineRow {
  float m, S, K;
};
DSV4_HD OnlineRow to_online(const SoftmaxState& st) {
  return OnlineRow{st.m, canonical_nan(st.s), softmax_value(st)};
}

// The state after an online decode step stores s and the next step reads it back: (M, S, K)
// rounded to the state's element type TS. `row` receives the stored values.
template <typename TS>
DSV4_HD SoftmaxState online_reload(const SoftmaxState& s, OnlineRow& row) {
  const TS* tag = nullptr;
  const OnlineRow o = to_online(s);
  row = OnlineRow{round_to(tag, o.m), round_to(tag, o.S), round_to(tag, o.K)};
  return from_online(row.m, row.S, row.K);
}

// Online decode's fold of one token (z = score + ape at its chunk offset) into s.
DSV4_HD void online_fold_token(SoftmaxState& s, float z, float kv) {
  const float zs[1] = {z}, kvs[1] = {kv};
  const bool present[1] = {true};
  softmax_fold<1>(s, zs, kvs, present);
}

// Online segments of at most this many tokens (every segment of a verify step: the reference
// engine verifies up to 8 tokens) are folded one token at a time, as online decode folds them,
// instead of pooled: their output row and stored state are the bytes of decoding the tokens.
constexpr int32_t kTokenFoldMax = 8;

DSV4_HD bool folds_by_token(const OnlineSegment& seg) {
  return seg.valid && seg.win.hi - seg.win.lo <= kTokenFoldMax;
}

// Channel ch of a by-token segment (rows w.in_lo .. w.in_hi - 1 of its resolved window, from
// the start state s: the stored state where it merges, else empty): each token folded as
// online decode folds it, the state reloaded in TS between tokens as decode stores it.
template <typename TS, typename TI>
DSV4_HD SoftmaxState online_fold_tokens(SoftmaxState s, const WindowRows& w, const TI* in,
                                        int64_t in_stride, const void* ape, int32_t ape_type,
                                        int hd, int ch) {
  for (int r = w.in_lo; r < w.in_hi; ++r) {
    if (r > w.in_lo) {
      OnlineRow stored;
      s = online_reload<TS>(s, stored);
    }
    const TI* row = in + (int64_t(w.in_base) + r) * in_stride;
    online_fold_token(s, load_as_f32(row, hd + ch) + load_ape(ape, ape_type, int64_t(r) * hd + ch),
                      load_as_f32(row, ch));
  }
  return s;
}

// ---- kernel parameters (both backends) --------------------------------------------------------

struct Params {
  void* state;          // kv_score_buffer (TS)
  const void* input;    // kv_score_input (TI)
  const void* ape;      // [win, hd], ape_type
  const uint8_t* plan;  // records of this pass
  void* out;            // [N, hd] out_type (nullptr: this pass writes no output)
  int64_t num_state_rows;  // flat rows of the state buffer
  int64_t num_in_rows;     // rows of kv_score_input
  int64_t in_row_stride;   // elements from one kv_score_input row to the next (>= its width)
  int64_t num_records;     // records of this pass
  int64_t num_out_rows;    // rows of out
  int32_t hd;
  int32_t cr;
  int32_t ape_type;
  int32_t out_type;
  int32_t online_store;  // online prefill pass over plan_w: store (M, S, K), no output
  int32_t after_pool;    // row writes launched right after this call's pooling kernel (GPU)
  int32_t records_per_block;  // c128 kernel (GPU): records per block, 0 / 1: one
  int32_t early_trigger;      // c4 decode (GPU): pdl_trigger() right after the row copy
};

}  // namespace compress
}  // namespace dsv4
