// c2_prefill_norm_rope_store GPU kernels (docs/contract.md, "V4.1" 2.6), shared by CUDA and HIP:
// the ratio-2 compressor over an extend batch, in two launches on one stream.
//   c2_prefill_pool_kernel<Encoding>: pass 1, one 32-lane group per row. An odd row with
//     raw_out_loc != 0 inside a request's range pools with row t-1 when that row is in the same
//     range, has the same rid, position pos-1 and raw_out_loc != 0, else with
//     state[slot(rid, pos-1)]; it writes its latent row and its cache slot raw_out_loc >> 1.
//   c2_prefill_park_kernel: pass 2, park_blocks blocks per request: the last min(len, ring) rows
//     of each request, padded ones skipped, copied bitwise to state[slot(rid, pos)]. It starts
//     after pass 1 has finished (stream order; with PDL its pdl_wait waits for pass 1's
//     completion), so no pass-1 read sees a pass-2 write.
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct C2PrefillKernelArgs {
  low_ratio::LatentOutputs out;  // unused by the park kernel
  const float* kv_score;         // [n_rows, 1024] kv | score
  float* state;                  // [state_rows, 1024]
  const void* positions;         // [n_rows] int32 (pos64 false) or int64
  const void* req;               // [n_rows] int32 (req64 false) or int64
  const void* raw_out_loc;       // [n_rows] int32 (loc64 false) or int64
  const int32_t* extend_start;   // [num_reqs]
  const int32_t* extend_lens;    // [num_reqs]
  int64_t n_rows;
  int64_t state_rows;
  int64_t ring;
  int64_t num_reqs;
  int64_t park_blocks;  // park kernel blocks per request (rows per block * park_blocks >= ring)
  bool pos64;
  bool req64;
  bool loc64;
  bool vec_in;     // kv_score 16-byte aligned
  bool vec_state;  // state 16-byte aligned
};

namespace low_ratio {

// The first row of the lowest request i whose range [start_i, start_i + len_i) holds row t
// (clipped to row 0), or -1 (zero-length requests hold none). The group scans 32 requests a
// step.
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

template <int kEncoding>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_prefill_pool_kernel(C2PrefillKernelArgs a) {
  using namespace low_ratio;
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / kLaneGroup) + threadIdx.x / kLaneGroup;
  pdl_wait();
  pdl_trigger();
  if (t >= a.n_rows) return;
  const int64_t raw = load_index(a.raw_out_loc, a.loc64, t);
  const int64_t pos = load_index(a.positions, a.pos64, t);
  const int64_t rid = load_index(a.req, a.req64, t);
  if (raw == 0 || pos % 2 == 0) return;  // padded and even rows write nothing in pass 1
  const int64_t first = request_start_of(a.extend_start, a.extend_lens, a.num_reqs, t, lane);
  if (first < 0) return;  // outside every request's range
  bool in_batch = false;
  if (t - 1 >= first) {
    in_batch = load_index(a.req, a.req64, t - 1) == rid &&
               load_index(a.positions, a.pos64, t - 1) == pos - 1 &&
               load_index(a.raw_out_loc, a.loc64, t - 1) != 0;
  }
  const float* src = in_batch ? a.kv_score + (t - 1) * kPairRowWidth
                              : ring_row(a.state, a.state_rows, a.ring, rid, pos - 1);
  if (src == nullptr) return;
  PairRow own, partner;
  RowValues w, lat;
  float f[4];
  load_pair_row(a.kv_score + t * kPairRowWidth, lane, a.vec_in, own);
  load_pair_row(src, lane, in_batch ? a.vec_in : a.vec_state, partner);
  load_weight(a.out.norm_weight, a.out.w_bf16, lane, a.out.vec_w, w);
  const bool rope_ok = load_rope_at(a.out, pos - 1, lane, f);
  pooled_latent(partner, own, w, a.out.eps, lat);
  publish_latent<kEncoding>(a.out, t, lane, lat, raw >> 1, rope_ok, f);
}

// Block b: request b / park_blocks; its lane group r of the request's rows (counting the
// request's blocks): the r-th of the last min(len, ring) rows of its range clipped to the
// input rows.
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_prefill_park_kernel(C2PrefillKernelArgs a) {
  using namespace low_ratio;
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t i = int64_t(blockIdx.x) / a.park_blocks;
  const int64_t r = (int64_t(blockIdx.x) % a.park_blocks) * (blockDim.x / kLaneGroup) +
                    threadIdx.x / kLaneGroup;
  pdl_wait();
  pdl_trigger();
  const int64_t s = a.extend_start[i], len = a.extend_lens[i];
  const int64_t begin = s < 0 ? 0 : s > a.n_rows ? a.n_rows : s;
  const int64_t e = len > 0 ? s + len : s;
  const int64_t end = e < begin ? begin : e > a.n_rows ? a.n_rows : e;
  const int64_t kept = end - begin < a.ring ? end - begin : a.ring;
  if (r >= kept) return;
  const int64_t t = end - kept + r;
  if (load_index(a.raw_out_loc, a.loc64, t) == 0) return;  // padded: skipped, not replaced
  float* dst = ring_row(a.state, a.state_rows, a.ring, load_index(a.req, a.req64, t),
                        load_index(a.positions, a.pos64, t));
  if (dst == nullptr) return;
  PairRow row;
  load_pair_row(a.kv_score + t * kPairRowWidth, lane, a.vec_in, row);
  store_pair_row(dst, lane, a.vec_state, row);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
