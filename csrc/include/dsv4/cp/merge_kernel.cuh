// merge_partials on the GPU (docs/contract.md 8): element-wise over the [num_windows, hd]
// elements, a thread per element in a grid-stride loop; the ranks' partials of one element are
// kMergeBlock-wide coalesced loads, the math is cp_math.h's merge_element.
#pragma once

#include "../cp_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace cp {

constexpr int kMergeBlock = 256;

__global__ void __launch_bounds__(kMergeBlock) cp_merge_kernel(const MergeParams p) {
  pdl_wait();
  const int64_t stride = int64_t(gridDim.x) * kMergeBlock;
  for (int64_t i = int64_t(blockIdx.x) * kMergeBlock + threadIdx.x; i < p.num_elems; i += stride)
    merge_element(p, i);
}

// Blocks of a merge launch: one element per thread, at most 8 waves of 8 blocks per
// multiprocessor (the grid-stride loop takes the rest).
inline int64_t merge_blocks(int64_t elems, int64_t sms) {
  const int64_t blocks = (elems + kMergeBlock - 1) / kMergeBlock, cap = 64 * sms;
  return blocks < cap ? blocks : cap;
}

}  // namespace cp
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
