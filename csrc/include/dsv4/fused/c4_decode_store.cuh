// compress_and_store's c4 decode kernel (docs/contract.md 11, docs/design/fused.md), shared by
// CUDA and HIP: one launch that pools a block's records with compress_forward's c4 decode code
// and then stores them with compress_norm_rope_store's (store_row), so the bytes are the pair's.
//
// c4_decode_store_kernel<TS, TI, TO, kFormat>: compress_forward's c4 decode block (kC4Block
// threads, kC4Block / (hd / 4) records: hd 512 one, hd 128 four), whose pooled rows go to the
// rows buffer (Params::out, of type TO: float or uint16_t, bf16 bits); after a block barrier one
// 32-lane group per record stores its row (StoreKernelArgs::kv = the same buffer, read back
// from L1 / L2).
// kFormat: a store kernel format (a V4.0 store format or fp8_ds_mla rows in a V4.1 layout,
// store_layout_format); its head_dim is the pooling's.
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::c4_decode_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "../compress/c4.cuh"
#include "../store/store_kernel.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kC4Block, DSV4_C4_MIN_BLOCKS)
    c4_decode_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  constexpr int kHd = store_kernel_head_dim(kFormat);
  constexpr int kGroup = compress::kC4Block / (kHd / compress::kVec);  // records of the block
  pdl_wait();
  compress::c4_record_group<TS, TI, true, kHd>(p, blockIdx.x, nullptr);
  __syncthreads();  // the block's rows are written (global memory, visible to the block)
  store_block_rows<kFormat, TO>(a, kGroup);
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
