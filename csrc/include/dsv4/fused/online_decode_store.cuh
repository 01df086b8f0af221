// compress_and_store's online cr 128 decode kernel (docs/contract.md 11, docs/design/fused.md),
// shared by CUDA and HIP: compress_forward's online decode fold (online_decode_entry) of a
// block's entries, then compress_norm_rope_store's store (store_row) of each, one launch.
//
// online_decode_store_kernel<TS, TI, TO, kFormat>: kBlock threads, kBlock / (hd / 4) entries (hd
// 512: two); the rows go to the rows buffer (Params::out, of type TO) and, after a
// block barrier, one 32-lane group per entry stores its row (the rows of entries that close no
// chunk are zeros and store nothing). kFormat: a store kernel format (a V4.0 store format or
// fp8_ds_mla rows in a V4.1 layout, store_layout_format).
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::online_decode_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "../compress/online_decode.cuh"
#include "../store/store_kernel.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kBlock, 2)
    online_decode_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  pdl_wait();
  compress::online_decode_entry<TS, TI>(p);
  __syncthreads();  // the block's rows are written (global memory, visible to the block)
  constexpr int kHd = store_kernel_head_dim(kFormat);
  store_block_rows<kFormat, TO>(a, compress::online_decode_per_block(kHd));
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
