// HIP compile check: the planner kernels exactly as the extension launches them
// (csrc/plan/plan_cuda.cu): the decode planner per addressing mode, the scan, the emission and
// the fused prefill kernels.
#include "../include/dsv4/plan/block_sizes.h"
#include "../include/dsv4/plan/decode_kernel.cuh"
#include "../include/dsv4/plan/prefill_emit_kernel.cuh"
#include "../include/dsv4/plan/prefill_fused_kernel.cuh"
#include "../include/dsv4/plan/prefill_scan_kernel.cuh"

namespace dsv4 {
#define DSV4_PLAN_DECODE_INSTANCE(ADDR)                                                \
  template __global__ void plan_decode_kernel<kPlanBlock, Addressing::ADDR>(           \
      PlanParams, const int64_t*, const int64_t*, int32_t, DecodePlan*);
DSV4_PLAN_DECODE_INSTANCE(kSwaPaged)
DSV4_PLAN_DECODE_INSTANCE(kReqRing)
DSV4_PLAN_DECODE_INSTANCE(kLegacy)
DSV4_PLAN_DECODE_INSTANCE(kOnline)
template __global__ void plan_prefill_scan_kernel<kPlanScanBlock>(
    PlanParams, const int64_t*, const int64_t*, int32_t, int64_t, ReqOffsets*, int32_t*);
template __global__ void plan_prefill_fused_kernel<kPlanBlock>(
    PlanParams, const int64_t*, const int64_t*, const int64_t*, int32_t, int64_t, int32_t*,
    uint8_t*, uint8_t*);
template __global__ void plan_prefill_emit_kernel<kPlanBlock>(
    PlanParams, const int64_t*, const ReqOffsets*, const DSV4_GRID_CONSTANT InlineOffsets,
    int32_t, int32_t, uint8_t*, uint8_t*);
}  // namespace dsv4
