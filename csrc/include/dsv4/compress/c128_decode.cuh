// cr = 128 offline decode (docs/contract.md 3.4): one step of every request; a request's
// window closes once in 128 steps. Torch-free.
//
// c128_decode_kernel<TS, TI, kHd>: c128_decode_blocks(events, kHd, groups) blocks of
// kC128Block = 512 threads, channel slices minor. Every block first copies its 64 channels of
// its requests' new input rows into the state (write_loc); the pooling step (c128_pool.cuh)
// reads the window row the step writes from its input row, as the copy stores it, so that no
// block waits for another block's copy.
//   * A small batch (Params::records_per_block <= 1, c128_decode_groups == 0): a block per
//     request and slice; a step that closes no window costs the copy's one round trip.
//   * A large batch: a block per slice and group of requests (c128_decode_records_per_block).
//     After the copies every block counts the closing requests of the whole step in request
//     order (c128_decode_scan) and pools its slice of those whose rank c has c % stride == e0:
//     the pooling is spread evenly over the blocks whatever pattern of requests closes (an
//     assignment of the block's own records serialises some pattern), and a step that closes
//     few windows costs about one block per multiprocessor slot. The partial states are
//     double-buffered, so that the merge of one record by the first 64 threads overlaps the
//     window loads of the next by the others.
#pragma once

#include "c128_pool.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace compress {

// Threads per record that copy the block's 64 channels of its input row (V channels each, kv
// half then score half), and the records whose copies a grouped block loads together with its
// plan records (more go in further rounds).
constexpr int kC128CopyLanes = 2 * kC128Lanes;
constexpr int kC128CopyAhead = 4 * (kC128Block / kC128CopyLanes);

// The scan of the step's closing requests runs in rounds of kScanChunks chunks of kC128Block
// plan records: thread t holds records t + kC128Block * j of the round, and the closing
// requests per lane group and chunk are double-buffered by round. Rounds of 2 chunks with the
// counts prefixed by lane shuffles were faster than a round per chunk whose every thread summed
// the counts of the groups before its own, and than rounds of 4 (docs/design/c128_pooling.md).
constexpr int kScanChunks = 2;
constexpr int kScanGroups = kC128Block / kLaneGroup;
static_assert(kScanGroups <= kLaneGroup, "the scan's lane-group counts fit one lane group");

using ScanCounts = int[2][kScanGroups][kScanChunks];

// Thread t's plan records of the scan round that starts at record b0.
DSV4_DEVICE void c128_load_scan_round(const Params& p, int64_t b0,
                                      DecodePlan (&scan_recs)[kScanChunks]) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int j = 0; j < kScanChunks; ++j) {
    const int64_t ev = b0 + j * kC128Block + t;
    if (ev < p.num_records) scan_recs[j] = reinterpret_cast<const DecodePlan*>(p.plan)[ev];
  }
}

// The step's closing requests in request order: recs / evs [0, returned count) get the plan
// records and indices of those that this block pools (rank c with c % stride == e0, as its
// pool c / stride). scan_recs holds the first round's records (loaded with the copy rows).
// The block's own records in recs must have been read (copies) before; starts with a barrier.
// 32-bit ranks and divisions (a 64-bit one is a slow library call, per thread and chunk): a
// grouped decode has fewer than 2^31 records (c128_decode_groups).
DSV4_DEVICE int c128_decode_scan(const Params& p, int64_t e0, int64_t stride,
                                 DecodePlan (&scan_recs)[kScanChunks],
                                 DecodePlan (&recs)[kC128MaxRecords],
                                 int32_t (&evs)[kC128MaxRecords], ScanCounts& group_closing) {
  const int t = int(threadIdx.x);
  __syncthreads();
  const uint32_t ustride = uint32_t(stride);
  const int lane_g = t % kLaneGroup, group = t / kLaneGroup;
  int64_t closing = 0;  // closing requests before the round
  for (int64_t b0 = 0, round = 0; b0 < p.num_records; b0 += kScanChunks * kC128Block, ++round) {
    if (round > 0) c128_load_scan_round(p, b0, scan_recs);
    int(&counts)[kScanGroups][kScanChunks] = group_closing[round & 1];
    bool closes[kScanChunks];
    uint32_t mask[kScanChunks];
#pragma unroll
    for (int j = 0; j < kScanChunks; ++j) {
      closes[j] = b0 + j * kC128Block + t < p.num_records &&
                  c128_record_pools<kModeDecode>(p, scan_recs[j]);
      mask[j] = group_ballot(closes[j]);
      if (lane_g == 0) counts[group][j] = __popc(mask[j]);
    }
    __syncthreads();  // (double-buffered counts: one barrier per round)
    // Per chunk, the closing requests up to lane group k, in lane k: a scan across lanes that
    // every warp does for itself (cheaper than a thread summing the groups before its own).
    int upto[kScanChunks];
#pragma unroll
    for (int j = 0; j < kScanChunks; ++j) upto[j] = lane_g < kScanGroups ? counts[lane_g][j] : 0;
#pragma unroll
    for (int d = 1; d < kScanGroups; d <<= 1) {
#pragma unroll
      for (int j = 0; j < kScanChunks; ++j) {
        const int u = shfl_idx(upto[j], lane_g >= d ? lane_g - d : lane_g);
        upto[j] += lane_g >= d ? u : 0;
      }
    }
    int total = 0;  // closing requests of the round's chunks before chunk j
#pragma unroll
    for (int j = 0; j < kScanChunks; ++j) {
      const int groups_before = shfl_idx(upto[j], group > 0 ? group - 1 : 0);
      const int before =
          total + (group > 0 ? groups_before : 0) + __popc(mask[j] & ((1u << lane_g) - 1u));
      total += shfl_idx(upto[j], kScanGroups - 1);
      if (closes[j]) {  // rank ci: pooled by the block with ci % stride == e0, as its pool q
        const uint32_t ci = uint32_t(closing + before), q = ci / ustride;
        if (ci - q * ustride == uint32_t(e0)) {
          recs[q] = scan_recs[j];
          evs[q] = int32_t(b0 + j * kC128Block + t);
        }
      }
    }
    closing += total;
  }
  __syncthreads();
  return closing > e0 ? int(uint32_t(closing - e0 + stride - 1) / ustride) : 0;
}

// One function for both batch sizes: the small batch's path returns early.
template <typename TS, typename TI, int kHd>
__global__ void DSV4_COMPRESS_BOUNDS(kC128Block, DSV4_C128_MIN_BLOCKS)
    c128_decode_kernel(const Params p) {
  constexpr int V = kC128Vec;
  alignas(16) __shared__ C128Parts parts[2];  // double-buffered (see above)
  constexpr int64_t kRow = 2 * int64_t(kHd);  // state rows (and input row width)
  using RawIn = typename RawVec<TI, V>::type;

  pdl_wait();
  constexpr int kSlices = kHd / kC128Ch;
  const int64_t e0 = blockIdx.x / kSlices;
  const int c0 = int(blockIdx.x % kSlices) * kC128Ch;  // the block's channels c0 .. c0 + 63
  const int t = int(threadIdx.x);
  TS* st = static_cast<TS*>(p.state);
  const TI* in = static_cast<const TI*>(p.input);
  // The V channels of a record's input row that thread t copies: of the kv half where
  // t % 64 < 32, of the score half where t % 64 >= 32.
  const int64_t copy_at = (t % kC128CopyLanes >= kC128Lanes ? kHd : 0) + c0 + (t % kC128Lanes) * V;

  if (p.records_per_block <= 1) {
    // A block per request and slice. The copy's input row is loaded together with the plan
    // record (the address does not depend on it), first thing: a step that closes no window
    // costs this one round trip, and every instruction before it adds to that.
    const bool has = t < kC128CopyLanes && e0 < p.num_in_rows;
    const RawIn cv =
        load_raw_if<TI, V, false>(has, in + e0 * p.in_row_stride + copy_at, RawIn{});
    const DecodePlan rec = reinterpret_cast<const DecodePlan*>(p.plan)[e0];
    const int64_t wl = rec.write_loc;
    if (has && wl >= 0 && wl < p.num_state_rows) {
      float f[V];
      unpack(cv, f);
      store_vec(st + wl * kRow + copy_at, f);
    }
    c128_pool<TS, TI, kModeDecode, kHd>(p, parts[0], e0, c0, c128_decode_rows(p, rec),
                                        OnlineSegment{}, c128_decode_new_row(p, rec, e0));
    return;
  }

  // A grouped block: records e0 + k * stride, k < nrec (nrec > 1). Record k's row is copied by
  // threads t with t / 64 == k % 8; the first kC128CopyAhead records' rows are loaded with the
  // plan records (their addresses do not depend on them).
  const int nrec = p.records_per_block;
  const int64_t stride = int64_t(gridDim.x) / kSlices;
  __shared__ DecodePlan recs[kC128MaxRecords];
  __shared__ int16_t order[kC128MaxRecords];
  __shared__ int n_pool, n_zero;
  __shared__ int32_t evs[kC128MaxRecords];  // the pooled requests
  __shared__ ScanCounts group_closing;
  const auto copy_row = [&](int k) {
    const int64_t e = e0 + k * stride;
    return k < nrec && e < p.num_records && e < p.num_in_rows ? in + e * p.in_row_stride + copy_at
                                                              : nullptr;
  };
  const auto copy_to = [&](int k, RawIn v) {
    if (copy_row(k) == nullptr) return;
    const int64_t wl = recs[k].write_loc;
    if (wl < 0 || wl >= p.num_state_rows) return;
    float f[V];
    unpack(v, f);
    store_vec(st + wl * kRow + copy_at, f);
  };
  constexpr int kStep = kC128Block / kC128CopyLanes;  // records whose rows a round copies
  constexpr int kAhead = kC128CopyAhead / kStep;
  RawIn cv[kAhead];
  DecodePlan scan_recs[kScanChunks];  // the scan round's plan records
#pragma unroll
  for (int j = 0; j < kAhead; ++j) {
    const TI* r = copy_row(t / kC128CopyLanes + j * kStep);
    cv[j] = load_raw_if<TI, V, false>(r != nullptr, r, RawIn{});
  }
  c128_load_scan_round(p, 0, scan_recs);
  c128_sort_records<kModeDecode>(p, e0, stride, nrec, recs, order, n_pool, n_zero);
#pragma unroll
  for (int j = 0; j < kAhead; ++j) copy_to(t / kC128CopyLanes + j * kStep, cv[j]);
  // Further rounds of kAhead rows (a large batch): all loads of a round, then its stores (a
  // store between two loads would keep the next load waiting for the one before).
  for (int k0 = kC128CopyAhead + t / kC128CopyLanes; k0 < nrec; k0 += kAhead * kStep) {
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const TI* r = copy_row(k0 + j * kStep);
      cv[j] = load_raw_if<TI, V, false>(r != nullptr, r, RawIn{});
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) copy_to(k0 + j * kStep, cv[j]);
  }
  c128_write_zero_rows<kHd>(p, e0, stride, nrec, order, n_zero, c0);
  const int to_pool = c128_decode_scan(p, e0, stride, scan_recs, recs, evs, group_closing);
  // No barrier between two records. Record i's partial states go to parts[i % 2], and a thread
  // writes them only after the barrier inside c128_pool of record i - 1 (every record here
  // pools, so every call reaches it), which the merging threads reach only once they have
  // merged record i - 2 from that buffer.
  for (int i = 0; i < to_pool; ++i) {
    const DecodePlan rec = recs[i];  // its row was copied above
    const int64_t e = evs[i];
    c128_pool<TS, TI, kModeDecode, kHd>(p, parts[i & 1], e, c0, c128_decode_rows(p, rec),
                                        OnlineSegment{}, c128_decode_new_row(p, rec, e));
  }
}

}  // namespace compress
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
