// GPU prefill scan for device lengths of more requests than the fused kernel takes: one block
// writes the per-request offsets (device_scan.cuh) and the counts, which the emission kernel
// then reads from global memory.
#pragma once

#include "device_scan.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

template <int kMax>
__global__ void __launch_bounds__(kMax)
    plan_prefill_scan_kernel(PlanParams p, const int64_t* __restrict__ seq_lens,
                             const int64_t* __restrict__ extend_lens, int32_t batch,
                             int64_t num_q_tokens, ReqOffsets* __restrict__ offs,
                             int32_t* __restrict__ counts) {
  __shared__ int64_t sh[kMax];
  pdl_wait();
  pdl_trigger();
  scan_request_offsets<kMax>(p, seq_lens, extend_lens, batch, num_q_tokens, offs, sh, counts);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
