// compress_and_store's c4 prefill kernel (docs/contract.md 11, docs/design/fused.md), shared by
// CUDA and HIP: compress_forward's c4 prefill pooling with the store of each pooled row in the
// same block (c4_group_store.cuh), so the rows are not read back by a store launch. The plan_w
// row writes follow in a launch of their own (compress_forward's write_rows_kernel).
//
// c4_prefill_store_kernel<TS, TI, TO, kFormat>: compress_forward's c4 prefill grid
// (c4_prefill_blocks); a block takes its record groups in turn (c4_prefill_turns), pooling and
// storing each (the V4.1 layouts: storing them after the last turn). kFormat: a store kernel
// format; TO: the rows buffer's type.
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::c4_prefill_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs);
#pragma once

#include "c4_group_store.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kC4Block, DSV4_C4_MIN_BLOCKS)
    c4_prefill_store_kernel(const compress::Params p, const StoreKernelArgs a) {
  constexpr int kGroup = c4_group_records(kFormat);
  __shared__ CompressPlan recs[compress::kC4MaxTurns * kGroup];
  // Turns alternate buffers: a turn's sums are written after every thread has passed the
  // previous turn's barrier, so after the reads of the turn before it.
  __shared__ float warp_sums[2][kSpreadWarpSums];
  pdl_wait();
  const CompressPlan* src = nullptr;
  const int turns = compress::c4_prefill_turns<kGroup>(p, recs, src);
  if constexpr (stores_from_registers(kFormat)) {
    for (int j = 0; j < turns; ++j)
      c4_pool_store_group<TS, TI, TO, kFormat, false>(
          p, a, blockIdx.x + int64_t(j) * gridDim.x, src + j * kGroup, warp_sums[j & 1]);
  } else {
    // The V4.1 layouts: every turn pooled into the rows buffer, then the block's rows stored by
    // its lane groups in turn. A store inside the turn loop made nvcc serialise the loop's
    // window loads (scripts/check_load_batching.py).
    constexpr int kHd = store_kernel_head_dim(kFormat);
    for (int j = 0; j < turns; ++j)
      compress::c4_record_group<TS, TI, false, kHd>(p, blockIdx.x + int64_t(j) * gridDim.x,
                                                    src + j * kGroup, compress::OutStore{p});
    __syncthreads();  // the block's rows are written (global memory, visible to the block)
    constexpr int kLaneGroups = compress::kC4Block / kLaneGroup;
    for (int k = int(threadIdx.x) / kLaneGroup; k < turns * kGroup; k += kLaneGroups)
      store_row<kFormat, TO, false>(a, (blockIdx.x + int64_t(k / kGroup) * gridDim.x) * kGroup +
                                           k % kGroup,
                                    int(threadIdx.x) % kLaneGroup);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
