// GPU prefill for device lengths of at most kFusedBatch requests in one kernel: every block
// scans the lengths into shared memory itself (device_scan.cuh, a few KiB of reads), then
// emits its rows (plan_prefill_row); block 0 writes the counts. Saves the scan kernel and the
// round trip of the offsets through global memory.
#pragma once

#include "device_scan.cuh"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

constexpr int kFusedBatch = 1023;

template <int kBlock>
__global__ void __launch_bounds__(kBlock)
    plan_prefill_fused_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                              const int64_t* __restrict__ seq_lens,
                              const int64_t* __restrict__ extend_lens, int32_t batch,
                              int64_t num_q_tokens, int32_t* __restrict__ counts,
                              uint8_t* __restrict__ plan_c, uint8_t* __restrict__ plan_w) {
  __shared__ ReqOffsets offs[kFusedBatch + 1];
  __shared__ int64_t sh[kBlock];
  pdl_wait();
  pdl_trigger();
  scan_request_offsets<kBlock>(p, seq_lens, extend_lens, batch, num_q_tokens, offs, sh,
                               blockIdx.x == 0 ? counts : nullptr);
  __syncthreads();
  const int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= num_q_tokens) return;
  plan_prefill_row(p, req_pool_indices, offs, batch, t, plan_c, plan_w);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
