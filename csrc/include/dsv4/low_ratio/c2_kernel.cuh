// c2_norm_rope_store GPU kernel (docs/contract.md, "V4.1" 2.4, 2.5), shared by CUDA and HIP: the
// ratio-2 compressor in decode (draft_len 1) and verify (draft_len D > 1, blocks of D consecutive
// positions of one request). Four 32-lane groups or one per row (kChunks 1 or 4,
// row_encode.cuh's mappings), several rows per block.
//   raw_out_loc <= 0: nothing (padded, also when its rid aliases a live request);
//   even pos: its 1024 input floats, bitwise, to state[slot(rid, pos)];
//   odd pos: pooled with its partner (input row t-1 inside a verify block, else
//            state[slot(rid, pos-1)]), latent row written, cache at raw_out_loc >> 1.
// A ring row outside the state skips the row. With ring > D no even row of a verify block parks
// on the slot its head reads, so the rows are independent.
//
// Instantiation: c2_norm_rope_store_kernel<Encoding, Chunks, CommonForm> (Encoding and Chunks as
// c1's; CommonForm true only with Chunks 1: the arguments of c2_common_form as constants).
#pragma once

#include "../plan_math.h"
#include "row_encode.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

struct C2KernelArgs {
  low_ratio::LatentOutputs out;
  low_ratio::PairInputs in;
  Divisor draft_len;  // make_divisor(draft_len): a block's rows found by a multiply
};

// The arguments of a serving engine's decode step (int64 indices, 16-byte aligned tensors, bf16
// norm weight, one DCP rank): the few-row launches run an instance with these as constants,
// a shorter machine code for a latency-bound launch (docs/design/low_ratio.md, "Few-row
// launches").
// c2_common_form(a): a is in that form.
DSV4_HD void set_c2_common_form(C2KernelArgs& a) {
  a.in.pos64 = a.in.req64 = a.in.loc64 = true;
  a.in.vec_in = a.in.vec_state = true;
  a.out.w_bf16 = true;
  a.out.vec_w = a.out.vec_freqs = a.out.vec_out = a.out.vec_latent = true;
  a.out.dcp = Dcp{};
}
DSV4_HD bool c2_common_form(const C2KernelArgs& a) {
  return a.in.pos64 && a.in.req64 && a.in.loc64 && a.in.vec_in && a.in.vec_state &&
         a.out.w_bf16 && a.out.vec_w && a.out.vec_freqs && a.out.vec_out && a.out.vec_latent &&
         dcp_is_identity(a.out.dcp);
}

template <int kEncoding, int kChunks, bool kCommonForm>
__global__ void __launch_bounds__(low_ratio::kBlockThreadsMax)
    c2_norm_rope_store_kernel(C2KernelArgs a) {
  using namespace low_ratio;
  static_assert(!kCommonForm || kChunks == 1, "the common-form instances are the few-row ones");
  if constexpr (kCommonForm) set_c2_common_form(a);
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
    // The row's own inputs go out with its indices (a padded row's are in bounds and unused).
    PairPart<kChunks> own;
    load_pair_part(in.row(t), r, in.vec_in, own);
    // Inside a verify block, not its head (always false for draft_len 1): a multiply while the
    // indices load. Row indices fit 31 bits (a row is 4 KB).
    const bool in_block = mod32(uint32_t(t), a.draft_len) != 0;
    if (raw > 0 && pos % 2 == 0) {
      in.park(rid, pos, r, own);
    } else if (raw > 0) {
      const float* partner = in_block ? in.row(t - 1) : in.ring_row(rid, pos - 1);
      closes = partner != nullptr;
      if (closes)
        load_pooled_inputs(a.out, r, own, partner, in_block ? in.vec_in : in.vec_state, pos, li);
    }
  }
  publish_latent<kEncoding>(a.out, r, closes, li, raw >> 1);  // every thread (a block barrier)
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
