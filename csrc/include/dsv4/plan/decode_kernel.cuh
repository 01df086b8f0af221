// GPU decode planner (CUDA and HIP from the same source): one thread per batch entry maps onto
// decode_record() of plan_math.h, the CPU planner's math, so both write the same DecodePlan.
#pragma once

#include "../plan_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

// kAddr: p.addressing as a compile-time constant, so that a thread runs only its addressing's
// code and reads only its parameters (a generic kernel branched on the mode and on p.online).
template <int kBlock, Addressing kAddr>
__global__ void __launch_bounds__(kBlock)
    plan_decode_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                       const int64_t* __restrict__ seq_lens, int32_t batch,
                       DecodePlan* __restrict__ out) {
  pdl_wait();
  pdl_trigger();
  const int64_t b = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (b >= batch) return;
  // Both reads go out together (load_now: not sunk below decode_record's seq_len check).
  const int64_t rid = load_now(req_pool_indices + b), seq_len = load_now(seq_lens + b);
  p.addressing = kAddr;
  p.online = kAddr == Addressing::kOnline;
  out[b] = decode_record(p, rid, seq_len);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
