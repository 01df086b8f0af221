// c2_norm_rope_store GPU kernel (docs/contract.md, "V4.1" 2.4, 2.5), shared by CUDA and HIP: the
// ratio-2 compressor in decode (draft_len 1) and verify (draft_len D > 1, blocks of D consecutive
// positions of one request). One 32-lane group per row, several rows per block.
//   raw_out_loc <= 0: nothing (padded, also when its rid aliases a live request);
//   even pos: its 1024 input floats, bitwise, to state[slot(rid, pos)];
//   odd pos: pooled with its partner (input row t-1 inside a verify block, else
//            state[slot(rid, pos-1)]), latent row written, cache at raw_out_loc >> 1.
// A ring row outside the state skips the row. With ring > D no even row of a verify block parks
// on the slot its head reads, so the rows are independent.
//
// Instantiation: c2_norm_rope_store_kernel<Encoding> (layout_encoding values, as c1's).
#pragma once

#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct C2KernelArgs {
  low_ratio::LatentOutputs out;
  const float* kv_score;    // [n_rows, 1024] kv | score
  float* state;             // [state_rows, 1024]
  const void* positions;    // [n_rows] int32 (pos64 false) or int64
  const void* req;          // [n_rows] int32 (req64 false) or int64
  const void* raw_out_loc;  // [n_rows] int32 (loc64 false) or int64
  int64_t n_rows;
  int64_t state_rows;
  int64_t ring;
  int64_t draft_len;
  bool pos64;
  bool req64;
  bool loc64;
  bool vec_in;     // kv_score 16-byte aligned
  bool vec_state;  // state 16-byte aligned
};

template <int kEncoding>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_norm_rope_store_kernel(C2KernelArgs a) {
  using namespace low_ratio;
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / kLaneGroup) + threadIdx.x / kLaneGroup;
  pdl_wait();
  pdl_trigger();
  if (t >= a.n_rows) return;
  const int64_t raw = load_index(a.raw_out_loc, a.loc64, t);
  const int64_t pos = load_index(a.positions, a.pos64, t);
  const int64_t rid = load_index(a.req, a.req64, t);
  // The row's own inputs go out with its indices (a padded row's are in bounds and unused).
  PairRow own;
  load_pair_row(a.kv_score + t * kPairRowWidth, lane, a.vec_in, own);
  if (raw <= 0) return;
  if (pos % 2 == 0) {
    float* dst = ring_row(a.state, a.state_rows, a.ring, rid, pos);
    if (dst != nullptr) store_pair_row(dst, lane, a.vec_state, own);
    return;
  }
  const bool in_block = a.draft_len > 1 && t % a.draft_len != 0;
  const float* src = in_block ? a.kv_score + (t - 1) * kPairRowWidth
                              : ring_row(a.state, a.state_rows, a.ring, rid, pos - 1);
  if (src == nullptr) return;
  RowValues w, lat;
  float f[4];
  PairRow partner;
  load_pair_row(src, lane, in_block ? a.vec_in : a.vec_state, partner);
  load_weight(a.out.norm_weight, a.out.w_bf16, lane, a.out.vec_w, w);
  const bool rope_ok = load_rope_at(a.out, pos - 1, lane, f);
  pooled_latent(partner, own, w, a.out.eps, lat);
  publish_latent<kEncoding>(a.out, t, lane, lat, raw >> 1, rope_ok, f);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
