// compress_and_store's c4 decode kernel (docs/contract.md 11, docs/design/fused.md), shared by
// CUDA and HIP: one launch that pools a block's records with compress_forward's c4 decode code
// and then stores them with compress_norm_rope_store's (c4_group_store.cuh).
//
// c4_decode_store_kernel<TS, TI, TO, kFormat>: compress_forward's c4 decode block (kC4Block
// threads, c4_group_records(kFormat) records: hd 512 one, hd 128 four), block b the records of
// group b. kFormat: a store kernel format (a V4.0 store format or fp8_ds_mla rows in a V4.1
// layout, store_layout_format); its head_dim is the pooling's. TO: the rows buffer's type.
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::c4_decode_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "c4_group_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kC4Block, DSV4_C4_MIN_BLOCKS)
    c4_decode_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  __shared__ float warp_sums[kSpreadWarpSums];
  pdl_wait();
  c4_pool_store_group<TS, TI, TO, kFormat, true>(p, a, blockIdx.x, nullptr, warp_sums);
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
