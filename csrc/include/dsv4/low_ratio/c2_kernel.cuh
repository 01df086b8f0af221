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
  low_ratio::PairInputs in;
  int64_t draft_len;
};

template <int kEncoding>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_norm_rope_store_kernel(C2KernelArgs a) {
  using namespace low_ratio;
  const PairInputs& in = a.in;
  int lane;
  const int64_t t = group_row(&lane);
  pdl_wait();
  pdl_trigger();
  if (t >= in.n_rows) return;
  const int64_t raw = in.raw(t), pos = in.pos(t), rid = in.rid(t);
  // The row's own inputs go out with its indices (a padded row's are in bounds and unused).
  PairRow own;
  load_pair_row(in.row(t), lane, in.vec_in, own);
  if (raw <= 0) return;
  if (pos % 2 == 0) {
    in.park(rid, pos, lane, own);
    return;
  }
  const bool in_block = a.draft_len > 1 && t % a.draft_len != 0;
  const float* partner = in_block ? in.row(t - 1) : in.ring_row(rid, pos - 1);
  if (partner == nullptr) return;
  close_pair<kEncoding>(a.out, t, lane, own, partner, in_block ? in.vec_in : in.vec_state, raw,
                        pos);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
