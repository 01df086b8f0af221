// GPU prefill emission: one thread per plan row runs plan_prefill_row() of plan_math.h (the
// CPU planner's loop body): the records of ragged token t and the invalid padding of row t,
// from per-request offsets computed on the host or by the scan kernel.
#pragma once

#include "../plan_math.h"

#if defined(DSV4_GPU_COMPILER)

namespace dsv4 {

// Host-lengths prefill of a small batch: the per-request offsets travel inside the emission
// kernel's parameters (CUDA: a __grid_constant__ parameter, read in place), which saves the
// pinned staging buffer, the device buffer and the host-to-device copy.
constexpr int kInlineOffsets = 64;  // batch + 1 entries, 1 KiB of parameters
struct InlineOffsets {
  ReqOffsets r[kInlineOffsets];
};

#if defined(DSV4_HIP)
#define DSV4_GRID_CONSTANT
#else
#define DSV4_GRID_CONSTANT __grid_constant__
#endif

// offs: the device offsets, or nullptr to read `inl` (CUDA only; see plan_cuda.cu).
template <int kBlock>
__global__ void __launch_bounds__(kBlock)
    plan_prefill_emit_kernel(PlanParams p, const int64_t* __restrict__ req_pool_indices,
                             const ReqOffsets* __restrict__ offs,
                             const DSV4_GRID_CONSTANT InlineOffsets inl, int32_t batch,
                             int32_t num_rows, uint8_t* __restrict__ plan_c,
                             uint8_t* __restrict__ plan_w) {
  pdl_wait();
  pdl_trigger();
  const int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (t >= num_rows) return;
  plan_prefill_row(p, req_pool_indices, offs != nullptr ? offs : inl.r, batch, t, plan_c, plan_w);
}

}  // namespace dsv4

#endif  // DSV4_GPU_COMPILER
