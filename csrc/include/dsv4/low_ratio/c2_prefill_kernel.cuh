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
};

namespace low_ratio {

// The first row of the lowest request i whose range [start_i, start_i + len_i) holds row t
// (clipped to row 0), or -1 (zero-length requests hold none). The lane group scans 32 requests
// a step (each of a row's groups scans for itself).
DSV4_DEVICE int64_t request_start_of(const int32_t* start, const int32_t* lens, int64_t num_reqs,
                                     int64_t t, int lane) {
  for (int64_t base = 0; base < num_reqs; base += kLaneGroup) {
    const int64_t i = base + lane;
    int64_t s = 0;
    bool hit = false;
    if (i < num_reqs) {
      s = start[i];
      const int64_t n = lens[i];
      hit = n > 0 && s <= t && t < s + n;
    }
    const uint32_t m = group_ballot(hit);
    if (m != 0u) {
      const int64_t first = shfl_idx(s, __ffs(int(m)) - 1);
      return first > 0 ? first : 0;
    }
  }
  return -1;
}

}  // namespace low_ratio

template <int kEncoding, int kChunks>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_prefill_pool_kernel(C2PrefillKernelArgs a) {
  using namespace low_ratio;
  const PairInputs& in = a.in;
  const RowThread r = row_thread<kChunks>();
  pdl_wait();
  pdl_trigger();
  LatentInputs<kChunks> li;
  bool closes = false;  // an odd row with its partner: publishes a latent
  int64_t raw = 0;
  if (r.row < in.n_rows) {
    const int64_t t = r.row;
    raw = in.raw(t);
    const int64_t pos = in.pos(t), rid = in.rid(t);
    // Padded and even rows write nothing in pass 1; neither do rows outside every request's range.
    const int64_t first = raw == 0 || pos % 2 == 0
                              ? -1
                              : request_start_of(a.extend_start, a.extend_lens, a.num_reqs, t,
                                                 r.lane);
    if (first >= 0) {
      const bool in_batch = t - 1 >= first && in.rid(t - 1) == rid && in.pos(t - 1) == pos - 1 &&
                            in.raw(t - 1) != 0;
      const float* partner = in_batch ? in.row(t - 1) : in.ring_row(rid, pos - 1);
      closes = partner != nullptr;
      if (closes) {
        PairPart<kChunks> own;
        load_pair_part(in.row(t), r, in.vec_in, own);
        load_pooled_inputs(a.out, r, own, partner, in_batch ? in.vec_in : in.vec_state, pos, li);
      }
    }
  }
  publish_latent<kEncoding>(a.out, r, closes, li, raw >> 1);  // every thread (a block barrier)
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
