// online_c128_mtp_mark_pending on the GPU (docs/contract.md 10.3): one block clears every
// pending entry, waits for its threads, then records the batch's lengths, so the two steps
// need no second launch.
#pragma once

#include "../spec_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {
namespace spec {

constexpr int kMarkBlock = 512;

__global__ void __launch_bounds__(kMarkBlock) mark_pending_kernel(const MarkPendingParams p) {
  pdl_wait();
  for (int64_t r = threadIdx.x; r < p.num_req_slots; r += kMarkBlock) p.pending[r] = -1;
  __syncthreads();
  for (int64_t b = threadIdx.x; b < p.batch; b += kMarkBlock) {
    const int64_t r = pending_row(p, b);
    if (r >= 0) p.pending[r] = load_index(p.seq_lens, p.seq_type, b);
  }
  pdl_trigger();
}

}  // namespace spec
}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
