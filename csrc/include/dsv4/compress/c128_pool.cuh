// The cr = 128 pooling step (docs/contract.md 1.2, 3.4, 3.5), shared by every cr = 128
// schedule: offline prefill and online segments (c128_prefill.cuh), offline decode
// (c128_decode.cuh). Torch-free.
//
// A block of kC128Block = 512 threads owns kC128Ch = 64 channels of one record at a time: 32
// lanes of kC128Vec = 2 channels x 16 row groups of kC128Rows = 8 rows. c128_pool is the step:
// each thread loads its 8 rows at once and folds them in registers (window_rows.cuh), the 16
// partial states per channel go to shared memory, and one thread per channel merges them (max
// first, then the sums) and writes the pooled value, or for an online segment merges it with
// the stored state and writes the output row or the new state. The schedules decide which
// record a block pools when; they also share the record-block step below (c128_sort_records,
// c128_write_zero_rows): a block of several records reads their plan records in one round trip,
// writes the zero rows of those that pool nothing and pools the others in turn.
#pragma once

#include "params.cuh"
#include "window_rows.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// Whether a cr = 128 record pools anything, from its resolved window (prefill, decode) or its
// online segment: a decode step that closes no window, and the invalid records / segments of
// a padded plan, do not.
template <int kMode>
DSV4_DEVICE bool c128_pools(const WindowRows& w, const OnlineSegment& seg) {
  return kMode != kModeOnline ? !window_empty(w, 128) : seg.valid;
}

// The same straight from a plan record: a prefill record, an online segment, or a decode
// record (DecodePlan).
template <int kMode>
DSV4_DEVICE bool c128_record_pools(const Params& p, const CompressPlan& rec) {
  if constexpr (kMode == kModeOnline) {
    return c128_pools<kMode>(WindowRows{}, online_segment(rec));
  } else {
    const WindowDesc d = offline_prefill_window(rec, 128);
    return c128_pools<kMode>(resolve_rows(d, 128, p.num_state_rows, p.num_in_rows),
                             OnlineSegment{});
  }
}
// The rows of a cr = 128 decode request's window (state rows only).
DSV4_DEVICE WindowRows c128_decode_rows(const Params& p, const DecodePlan& rec) {
  return resolve_state_rows(offline_decode_window(rec, 128), 128, p.num_state_rows);
}
template <int kMode>
DSV4_DEVICE bool c128_record_pools(const Params& p, const DecodePlan& rec) {
  return c128_pools<kMode>(c128_decode_rows(p, rec), OnlineSegment{});
}

// Decode: the window row that request e's step writes (-1: none in the window, or no input row
// or state slot for it).
DSV4_DEVICE int32_t c128_decode_new_row(const Params& p, const DecodePlan& rec, int64_t e) {
  const int64_t wl = rec.write_loc, r = wl - int64_t(rec.read_page_1) * 128;
  return e < p.num_in_rows && wl >= 0 && wl < p.num_state_rows && r >= 0 && r < 128
             ? int32_t(r)
             : int32_t(-1);
}

// The row groups' partial states (m, s, a) of one pooled record, per channel of the block.
using C128Parts = float[3][kC128RowGroups][kC128Ch];

// Thread (g, lane)'s window rows U*g .. U*g+U-1 of record e at channels c .. c+V-1, and their
// ape rows: logits z (score + ape) and kv. Row r = U*g + u: input row in_base + r, or row r of
// page1, both at offset u * kInRow from their base (the input base steps by the input's row
// stride less kInRow; online windows have no state rows, whose stride differs). A closing
// cr = 128 decode window spans rows [0, 128) of page1 (seq_len >= 128), so past the
// empty-window exit every decode row is present: a state row, except the one the step writes
// (new_row), which is read from its input row as the copy stores it (no block waits for a
// copy, its own or another block's); the input base is then the one that row's offset reaches.
// Mixed dtypes: with the wider state type (fp32 state, bf16 input) through load_rows_either,
// else (bf16 state, fp32 input) as one extra load pair of the warp that holds it (g is
// warp-uniform). Each is the form that kept its instance fast: the extra pair spilled the
// former in the grouped loop (ptxas -v), and load_rows_either made the latter slower
// (docs/design/c128_pooling.md).
template <typename TS, typename TI, int kMode, int kHd>
DSV4_DEVICE void c128_load_window(const Params& p, int64_t e, int c, const WindowRows& w,
                                  int32_t new_row, float (&z)[kC128Rows][kC128Vec],
                                  float (&kv)[kC128Rows][kC128Vec]) {
  constexpr int V = kC128Vec, U = kC128Rows;
  constexpr bool kDecode = kMode == kModeDecode;
  constexpr int64_t kInRow = 2 * int64_t(kHd);
  constexpr int64_t kStRow = kMode == kModeOnline ? 3 * int64_t(kHd) : kInRow;
  using RawIn = typename RawVec<TI, V>::type;
  const int g = int(threadIdx.x) / kC128Lanes;  // row group: window rows U*g .. U*g+U-1
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);

  constexpr bool kSameType = std::is_same<TS, TI>::value;
  constexpr bool kEither = kDecode && !kSameType && sizeof(TS) > sizeof(TI);
  constexpr bool kNewPair = kDecode && !kSameType && !kEither;
  const int64_t in_stride = p.in_row_stride;
  const int64_t in_step = kDecode ? 0 : in_stride - kInRow;
  const TI* in_g = kDecode ? in + (e * in_stride - int64_t(new_row - g * U) * kInRow + c)
                           : in + ((int64_t(w.in_base) + g * U) * in_stride + c);
  const TS* st_g = st + ((int64_t(w.page1_ok ? w.page1 : 0) * 128 + g * U) * kStRow + c);
  bool fs[U], fi[U];
  const TS* sb[U];
  const TI* ib[U];
  int64_t off[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    fi[u] = kDecode ? !kNewPair && g * U + u == new_row : row_from_input(w, g * U + u);
    fs[u] = kDecode ? g * U + u != new_row
                    : kMode == kModePrefill && row_from_state(w, 128, g * U + u);
    sb[u] = st_g;
    ib[u] = in_g + u * in_step;
    off[u] = u * kInRow;
  }
  const bool new_here = kNewPair && new_row >= 0 && new_row / U == g;
  RawIn new_kv{}, new_sc{};
  if constexpr (kNewPair) {
    const TI* r = in + e * in_stride + c;
    new_kv = load_raw_if<TI, V>(new_here, r, RawIn{});
    new_sc = load_raw_if<TI, V>(new_here, r + kHd, RawIn{});
  }
  if constexpr (kEither)
    load_rows_either<TS, TI>(fs, fi, st_g, in_g, off, kHd, kv, z);
  else
    load_rows(fs, fi, sb, ib, off, kHd, kv, z);
  float a[U][V];
  load_ape_rows<U, V, kHd, kDecode>(p.ape, p.ape_type, int64_t(g * U) * kHd + c, a);
  if (new_here) {  // (after the ape loads are issued: this waits for the loads)
    float k[V], sc[V];
    unpack(new_kv, k);
    unpack(new_sc, sc);
    round_vec<TS, V>(k);  // as the state holds it (a bf16 state rounds an fp32 input)
    round_vec<TS, V>(sc);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (g * U + u != new_row) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        kv[u][j] = k[j];
        z[u][j] = sc[j];
      }
    }
  }
  add_ape(a, z);
}

// Threads t < kC128Ch: merge channel c0 + t's partial states (the common max first, then
// independent rescales) and write the result: out[e], or for an online segment the merge with
// the stored state (when the segment does not start its chunk), then out[e] = K
// (p.online_store == 0) or the state (M, S, K) at the segment's write slot.
template <typename TS, int kMode, int kHd>
DSV4_DEVICE void c128_merge_parts(const Params& p, const C128Parts& part, int64_t e, int c0,
                                  const OnlineSegment& seg) {
  constexpr int64_t kStRow = kMode == kModeOnline ? 3 * int64_t(kHd) : 2 * int64_t(kHd);
  const int t = int(threadIdx.x);
  if (t >= kC128Ch) return;
  const int cc = t;
  const int ch = c0 + cc;
  float M = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < kC128RowGroups; ++k) M = fmaxf(M, part[0][k][cc]);
  float S = 0.0f, A = 0.0f;
#pragma unroll
  for (int k = 0; k < kC128RowGroups; ++k) {
    const float f = fexp(part[0][k][cc] - M);
    S = fmaf(part[1][k][cc], f, S);
    A = fmaf(part[2][k][cc], f, A);
  }
  SoftmaxState x{M, S, A};
  if constexpr (kMode == kModeOnline) {
    TS* st = static_cast<TS*>(p.state);
    if (seg.merge) {
      SoftmaxState y = softmax_empty();
      if (seg.read_slot >= 0 && seg.read_slot < p.num_state_rows) {
        const TS* r = st + seg.read_slot * kStRow;
        y = from_online(load_as_f32(r, ch), load_as_f32(r, kHd + ch),
                        load_as_f32(r, 2 * int64_t(kHd) + ch));
      }
      softmax_merge(y, x);
      x = y;
    }
    if (!p.online_store) {
      store_out(p.out, p.out_type, e * kHd + ch, softmax_value(x));
    } else if (seg.valid && seg.write_slot >= 0 && seg.write_slot < p.num_state_rows) {
      TS* r = st + seg.write_slot * kStRow;
      const OnlineRow o = to_online(x);
      store_from_f32(r, ch, o.m);
      store_from_f32(r, kHd + ch, o.S);
      store_from_f32(r, 2 * int64_t(kHd) + ch, o.K);
    }
  } else {
    store_out(p.out, p.out_type, e * kHd + ch, softmax_value(x));
  }
}

// Threads t < kC128Ch: an online segment of at most kTokenFoldMax tokens folded token by token
// at channel c0 + t, from the stored state where it merges (compress_math.h: the bytes of
// online decode), into out[e] or its write slot.
template <typename TS, typename TI, int kHd>
DSV4_DEVICE void c128_fold_tokens(const Params& p, int64_t e, int c0, const WindowRows& w,
                                  const OnlineSegment& seg) {
  constexpr int64_t kStRow = 3 * int64_t(kHd);
  const int t = int(threadIdx.x);
  if (t >= kC128Ch) return;
  const int ch = c0 + t;
  TS* st = static_cast<TS*>(p.state);
  SoftmaxState x = softmax_empty();
  if (seg.merge && seg.read_slot >= 0 && seg.read_slot < p.num_state_rows) {
    const TS* r = st + seg.read_slot * kStRow;
    x = from_online(load_as_f32(r, ch), load_as_f32(r, kHd + ch),
                    load_as_f32(r, 2 * int64_t(kHd) + ch));
  }
  x = online_fold_tokens<TS, TI>(x, w, static_cast<const TI*>(p.input), p.in_row_stride, p.ape,
                                 p.ape_type, kHd, ch);
  if (!p.online_store) {
    store_out(p.out, p.out_type, e * kHd + ch, softmax_value(x));
  } else if (seg.write_slot >= 0 && seg.write_slot < p.num_state_rows) {
    TS* r = st + seg.write_slot * kStRow;
    const OnlineRow o = to_online(x);
    store_from_f32(r, ch, o.m);
    store_from_f32(r, kHd + ch, o.S);
    store_from_f32(r, 2 * int64_t(kHd) + ch, o.K);
  }
}

// The pooling step: record e's window w (seg: an online segment) at the block's channels
// c0 .. c0 + 63 into out[e] or the online state; an online segment of at most kTokenFoldMax
// tokens is folded token by token instead (c128_fold_tokens). Decode: new_row is the window
// row the step writes, pooled from input row e (-1: none). part: where the row groups'
// partial states go.
// A record that pools nothing (a decode step that closes none, an invalid record or segment of
// a padded plan) writes zeros, or nothing in the online store pass; that is uniform across the
// block, so no thread is left waiting at the barrier.
template <typename TS, typename TI, int kMode, int kHd>
DSV4_DEVICE void c128_pool(const Params& p, C128Parts& part, int64_t e, int c0,
                           const WindowRows& w, const OnlineSegment& seg, int32_t new_row) {
  constexpr int V = kC128Vec, U = kC128Rows;
  const int t = int(threadIdx.x);
  const int g = t / kC128Lanes;
  const int lane = t % kC128Lanes;
  if (!c128_pools<kMode>(w, seg)) {
    if (p.out != nullptr && t < kC128Ch) store_out(p.out, p.out_type, e * kHd + c0 + t, 0.0f);
    return;
  }
  if constexpr (kMode == kModeOnline) {
    if (folds_by_token(seg)) {  // uniform across the block
      pdl_trigger();
      c128_fold_tokens<TS, TI, kHd>(p, e, c0, w, seg);
      return;
    }
  }
  float z[U][V], kv[U][V];
  c128_load_window<TS, TI, kMode, kHd>(p, e, c0 + lane * V, w, new_row, z, kv);
  pdl_trigger();

  // One partial state per row group and channel; the merge combines the row groups.
  SoftmaxState acc[V];
  fold_window<U, V>(acc, z, kv);
  {
    float m[V], sum[V], acc_a[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      m[j] = acc[j].m;
      sum[j] = acc[j].s;
      acc_a[j] = acc[j].a;
    }
    store_vec(&part[0][g][lane * V], m);
    store_vec(&part[1][g][lane * V], sum);
    store_vec(&part[2][g][lane * V], acc_a);
  }
  __syncthreads();
  c128_merge_parts<TS, kMode, kHd>(p, part, e, c0, seg);
}

// The record-block step of a block of nrec > 1 records e0 + k * stride, k < nrec: thread k
// reads plan record k (all in one round trip) into recs[k] and sorts it: order[0, n_pool) are
// the records to pool, order[nrec - n_zero, nrec) those that pool nothing. Which of its
// records a block pools first changes no result. Starts and ends with a barrier.
template <int kMode, typename Rec>
DSV4_DEVICE void c128_sort_records(const Params& p, int64_t e0, int64_t stride, int nrec,
                                   Rec (&recs)[kC128MaxRecords],
                                   int16_t (&order)[kC128MaxRecords], int& n_pool, int& n_zero) {
  const int t = int(threadIdx.x);
  if (t == 0) n_pool = n_zero = 0;
  __syncthreads();
  if (t < nrec && e0 + t * stride < p.num_records) {
    const Rec rec = reinterpret_cast<const Rec*>(p.plan)[e0 + t * stride];
    recs[t] = rec;
    if (c128_record_pools<kMode>(p, rec))
      order[atomicAdd(&n_pool, 1)] = int16_t(t);
    else
      order[nrec - 1 - atomicAdd(&n_zero, 1)] = int16_t(t);
  }
  __syncthreads();
}

// The zero output rows (the block's 64 channels) of the sorted records that pool nothing,
// written together.
template <int kHd>
DSV4_DEVICE void c128_write_zero_rows(const Params& p, int64_t e0, int64_t stride, int nrec,
                                      const int16_t (&order)[kC128MaxRecords], int n_zero,
                                      int c0) {
  if (p.out == nullptr) return;
  const int t = int(threadIdx.x);
  constexpr int kLanesPerRow = kC128Ch / 4;  // 4 channels per thread
  const float zero[4] = {};
  for (int k = nrec - n_zero + t / kLanesPerRow; k < nrec; k += kC128Block / kLanesPerRow)
    store_out_vec(p.out, p.out_type,
                  (e0 + order[k] * stride) * kHd + c0 + (t % kLanesPerRow) * 4, zero);
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
