// compress_and_store's c4 decode kernel (docs/contract.md 11, docs/design/fused.md), shared by
// CUDA and HIP: one launch that pools a block's records with compress_forward's c4 decode code
// and then stores them with compress_norm_rope_store's (store_row), so the bytes are the pair's.
//
// c4_decode_store_kernel<TS, TI, TO, kFormat>: compress_forward's c4 decode block (kC4Block
// threads, kC4Block / (hd / 4) records: hd 512 one, hd 128 four), whose pooled rows go to the
// rows buffer (Params::out, of type TO: float or uint16_t, bf16 bits). fp8_ds_mla and bf16 (hd
// 512): the pooling threads then store the row from their registers (spread_store.cuh); hd
// 128: a record's 32 pooling threads are its store lane group and run store_row on their own
// values; the V4.1 layouts: after a block barrier, one 32-lane group per record stores its row
// (StoreKernelArgs::kv = the same buffer, read back from L1 / L2).
// kFormat: a store kernel format (a V4.0 store format or fp8_ds_mla rows in a V4.1 layout,
// store_layout_format); its head_dim is the pooling's.
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::c4_decode_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "../compress/c4.cuh"
#include "../store/store_kernel.cuh"
#include "spread_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kC4Block, DSV4_C4_MIN_BLOCKS)
    c4_decode_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  constexpr int kHd = store_kernel_head_dim(kFormat);
  constexpr int kGroup = compress::kC4Block / (kHd / compress::kVec);  // records of the block
  pdl_wait();
  if constexpr (store_format_spreads(kFormat)) {
    // hd 512, V4.0 format: the block's one row stored from the pooling threads' registers.
    static_assert(kGroup == 1 && compress::kC4Block == kSpreadThreads, "one row a block");
    __shared__ float warp_sums[kSpreadWarpSums];
    const int u = int(threadIdx.x);
    const SpreadTarget s = spread_target(a, blockIdx.x, u);
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::c4_record_group<TS, TI, true, kHd>(
        p, blockIdx.x, nullptr, [&](int64_t i, const float (&v)[4]) {
          compress::store_out_vec(p.out, p.out_type, i, v);
          as_rows_buffer<TO>(v, x);
        });
    store_spread_row<kFormat>(a, s, x, u, warp_sums);
  } else if constexpr (kHd == 4 * kLaneGroup) {
    // hd 128: a record's 32 pooling threads are its store lane group (lane l: dims 4l..4l+3).
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::c4_record_group<TS, TI, true, kHd>(
        p, blockIdx.x, nullptr, [&](int64_t i, const float (&v)[4]) {
          compress::store_out_vec(p.out, p.out_type, i, v);
          as_rows_buffer<TO>(v, x);
        });
    store_row<kFormat, TO, false, true>(a, int64_t(blockIdx.x) * kGroup + threadIdx.x / kLaneGroup,
                                        int(threadIdx.x) % kLaneGroup, x);
  } else {
    compress::c4_record_group<TS, TI, true, kHd>(p, blockIdx.x, nullptr, compress::OutStore{p});
    __syncthreads();  // the block's rows are written (global memory, visible to the block)
    store_block_rows<kFormat, TO>(a, kGroup);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
