// The step of the fused cr 4 kernels (docs/design/fused.md), shared by CUDA and HIP: one block's
// group of records pooled with compress_forward's c4 code (c4_record_group) and stored with
// compress_norm_rope_store's, so the bytes are the pair's. c4_decode_store_kernel runs it once,
// c4_prefill_store_kernel once a turn.
//
// The store by the rows' place against the store's lane layout (lane l of a 32-lane group:
// dims 128 j + 4 l + k): fp8_ds_mla and bf16 (hd 512): the block's 128 pooling threads store the
// row from their registers (spread_store.cuh); hd 128: a record's 32 pooling threads are its
// lane group and run store_row on their own values; the V4.1 layouts: after a block barrier,
// one 32-lane group per record stores its row read back from the rows buffer (Params::out, of
// type TO: float or uint16_t, bf16 bits). The register forms write that buffer only for a
// caller's `out` (Params::out null otherwise, stores_from_registers).
#pragma once

#include "../compress/c4.cuh"
#include "../store/store_kernel.cuh"
#include "spread_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

// Records of one c4 block's group for a store kernel format (hd 512: one, hd 128: four).
DSV4_HD constexpr int c4_group_records(int format) {
  return compress::kC4Block / (store_kernel_head_dim(format) / compress::kVec);
}

// Group `group` (rows group * c4_group_records .. + c4_group_records - 1): kDecode, DecodePlan
// records (recs unused); prefill, the group's CompressPlan records `recs`, and the caller's
// `out` rows written with streaming stores (no kernel of the call reads them). Every thread of
// the block calls it (barriers). warp_sums: kSpreadWarpSums floats of shared memory that no
// thread reads for another row until the block's next barrier.
template <typename TS, typename TI, typename TO, int kFormat, bool kDecode>
DSV4_DEVICE void c4_pool_store_group(const compress::Params& p, const StoreKernelArgs& a,
                                     int64_t group, const CompressPlan* recs,
                                     float* warp_sums) {
  constexpr int kHd = store_kernel_head_dim(kFormat);
  constexpr int kGroup = c4_group_records(kFormat);
  if constexpr (store_format_spreads(kFormat)) {
    static_assert(kGroup == 1 && compress::kC4Block == kSpreadThreads, "one row a block");
    const int u = int(threadIdx.x);
    const SpreadTarget s = spread_target(a, group, u);
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::c4_record_group<TS, TI, kDecode, kHd>(
        p, group, recs, [&](int64_t i, const float (&v)[4]) {
          if (p.out != nullptr) compress::store_out_vec<4, !kDecode>(p.out, p.out_type, i, v);
          as_rows_buffer<TO>(v, x);
        });
    store_spread_row<kFormat>(a, s, x, u, warp_sums);
  } else if constexpr (kHd == 4 * kLaneGroup) {
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::c4_record_group<TS, TI, kDecode, kHd>(
        p, group, recs, [&](int64_t i, const float (&v)[4]) {
          if (p.out != nullptr) compress::store_out_vec<4, !kDecode>(p.out, p.out_type, i, v);
          as_rows_buffer<TO>(v, x);
        });
    store_row<kFormat, TO, false, true>(a, group * kGroup + threadIdx.x / kLaneGroup,
                                        int(threadIdx.x) % kLaneGroup, x);
  } else {
    compress::c4_record_group<TS, TI, kDecode, kHd>(p, group, recs, compress::OutStore{p});
    __syncthreads();  // the group's rows are written (global memory, visible to the block)
    store_block_rows<kFormat, TO>(a, group * kGroup, kGroup);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
