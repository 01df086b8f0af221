// compress_and_store's online cr 128 decode kernel (docs/contract.md 11, docs/design/fused.md),
// shared by CUDA and HIP: compress_forward's online decode fold (online_decode_entry) of a
// block's entries, then compress_norm_rope_store's store (store_row) of each, one launch.
//
// online_decode_store_kernel<TS, TI, TO, kFormat>: kBlock threads, kBlock / (hd / 4) entries (hd
// 512: two); the rows go to the rows buffer (Params::out, of type TO). fp8_ds_mla and bf16 (hd
// 512): each entry's 128 threads then store its row from their registers (spread_store.cuh); hd
// 128: an entry's 32 threads are its store lane group and run store_row on their own values;
// the V4.1 layouts: after a block barrier, one 32-lane group per entry stores its row (the rows
// of entries that close no chunk are zeros and store nothing). kFormat: a store kernel format
// (a V4.0 store format or fp8_ds_mla rows in a V4.1 layout, store_layout_format).
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::online_decode_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "../compress/online_decode.cuh"
#include "../store/store_kernel.cuh"
#include "spread_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kBlock, 2)
    online_decode_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  pdl_wait();
  constexpr int kHd = store_kernel_head_dim(kFormat);
  constexpr int kPerBlock = compress::kBlock / (kHd / compress::kVec);
  if constexpr (store_format_spreads(kFormat)) {
    // hd 512, V4.0 format: each of the block's rows stored from its pooling threads' registers.
    static_assert(kHd / compress::kVec == kSpreadThreads, "128 threads a row");
    __shared__ float warp_sums[kPerBlock][kSpreadWarpSums];
    const int u = int(threadIdx.x) % kSpreadThreads, r = int(threadIdx.x) / kSpreadThreads;
    const SpreadTarget s = spread_target(a, int64_t(blockIdx.x) * kPerBlock + r, u);
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::online_decode_entry<TS, TI>(p, [&](int64_t i, const float (&v)[4]) {
      if (p.out != nullptr) compress::store_out_vec(p.out, p.out_type, i, v);
      as_rows_buffer<TO>(v, x);
    });
    store_spread_row<kFormat>(a, s, x, u, warp_sums[r]);
  } else if constexpr (kHd == 4 * kLaneGroup) {
    // hd 128: an entry's 32 threads are its store lane group (lane l: dims 4l..4l+3).
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    compress::online_decode_entry<TS, TI>(p, [&](int64_t i, const float (&v)[4]) {
      if (p.out != nullptr) compress::store_out_vec(p.out, p.out_type, i, v);
      as_rows_buffer<TO>(v, x);
    });
    store_row<kFormat, TO, false, true>(
        a, int64_t(blockIdx.x) * kPerBlock + threadIdx.x / kLaneGroup,
        int(threadIdx.x) % kLaneGroup, x);
  } else {
    compress::online_decode_entry<TS, TI>(p, compress::OutStore{p});
    __syncthreads();  // the block's rows are written (global memory, visible to the block)
    store_block_rows<kFormat, TO>(a, int64_t(blockIdx.x) * kPerBlock, kPerBlock);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
