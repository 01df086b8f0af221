// compress_and_store's second launch of a cr 128 offline prefill (docs/contract.md 11,
// docs/design/fused.md), shared by CUDA and HIP: compress_forward's plan_w row writes and
// compress_norm_rope_store's store of the pooled rows in one grid, after the pooling launch
// (c128_prefill_kernel). A record's channels are pooled by hd / 64 blocks, so its store waits
// for the whole pooling grid; the row writes wait for its reads. Both wait for the same kernel,
// so they run side by side instead of one after the other.
//
// write_rows_store_kernel<TS, TI, TO, kFormat>(pw, a, store_blocks): kBlock threads; blocks
// 0 .. store_blocks - 1 (write_store_blocks) store the rows buffer (a.kv, of type TO), one
// 32-lane group a row (store_row), the others copy the plan_w rows (compress::write_rows,
// compress::lane_group_blocks). The store blocks come first: the hardware hands out blocks in
// index order, and behind a padded plan's 2048 row-write blocks they start a wave late.
//
// Instantiation (fused/instantiations/, through kernel_set_def.cuh), e.g.
//   template __global__ void dsv4::fused::write_rows_store_kernel<float, float, float, 0>(
//       dsv4::compress::Params, dsv4::StoreKernelArgs, int);
#pragma once

#include "../compress/write_rows.cuh"
#include "../store/store_kernel.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace fused {

// Four blocks an SM (at most 64 registers, the store kernel's own count): a padded plan's
// 2048 row-write blocks, nearly all without a valid record, then take half the waves they take
// at two.
constexpr int kWriteStoreMinBlocks = 4;

template <typename TS, typename TI, typename TO, int kFormat>
__global__ void DSV4_COMPRESS_BOUNDS(compress::kBlock, kWriteStoreMinBlocks)
    write_rows_store_kernel(const compress::Params pw, const StoreKernelArgs a, int store_blocks) {
  constexpr int kHd = store_kernel_head_dim(kFormat);
  if (int(blockIdx.x) >= store_blocks) {
    compress::write_rows<TS, TI, 2 * kHd>(pw, int64_t(blockIdx.x) - store_blocks,
                                          int64_t(gridDim.x) - store_blocks);
    return;
  }
  pdl_wait();  // the pooling grid has written every row
  // Lane group g of G takes rows g + G * (lane + 32 i): each lane tests one row's record, and
  // the group stores the rows that store, one after the other. A padded plan's invalid tail
  // costs a record read per lane, 32 rows a round trip; the valid rows at its head fall on
  // lane 0 of as many groups.
  constexpr int kGroupsPerBlock = compress::kBlock / kLaneGroup;
  const int lane = int(threadIdx.x) % kLaneGroup;
  const int64_t groups = int64_t(store_blocks) * kGroupsPerBlock;
  for (int64_t base = int64_t(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kLaneGroup;
       base < a.n_rows; base += groups * kLaneGroup) {
    const int64_t t = base + groups * lane;
    bool stores = false;
    if (t < a.n_rows) {
      const uint2 head = plan_head(a, t);
      int64_t loc_index = 0, pos = 0;
      stores = store_row_target(head.x, int32_t(head.y), a.is_decode, a.compress_ratio, t,
                                a.num_out_loc, a.max_pos, &loc_index, &pos);
    }
    for (uint32_t m = group_ballot(stores); m != 0u; m &= m - 1u)
      store_row<kFormat, TO, false>(a, base + groups * (__ffs(int(m)) - 1), lane);
  }
}

}  // namespace fused
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
